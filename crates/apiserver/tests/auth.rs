//! TLS and authentication: the server speaks only TLS with a certificate its kubeconfig's CA
//! verifies, and answers every request without a known bearer token 401 (anonymous auth off, as
//! kube-apiserver with `--anonymous-auth=false`), creating nothing.
// Test code (helpers included): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

const UNAUTHORIZED: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#;

/// The CA certificate a kubeconfig embeds.
fn kubeconfig_ca(yaml: &str) -> CertificateDer<'static> {
    let kc = kube::config::Kubeconfig::from_yaml(yaml).unwrap();
    let data = kc.clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .certificate_authority_data
        .clone()
        .unwrap();
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap();
    CertificateDer::from_pem_slice(&pem).unwrap()
}

fn kubeconfig_token(yaml: &str) -> String {
    let v: Value = serde_saphyr::from_str(yaml).unwrap();
    v["users"][0]["user"]["token"].as_str().unwrap().to_string()
}

async fn tls_connect(
    server: &apiserver::RunningApiServer,
    ca: CertificateDer<'static>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, std::io::Error> {
    apiserver::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).unwrap();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    connector.connect(name, tcp).await
}

/// One HTTP/1.1 request over TLS (verified against the kubeconfig's CA): (code, body).
async fn raw(
    server: &apiserver::RunningApiServer,
    method: &str,
    path: &str,
    host: &str,
    authorization: Option<&str>,
    body: Option<Value>,
) -> (u16, String) {
    let tls = tls_connect(server, kubeconfig_ca(&server.kubeconfig_yaml()))
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, host);
    if let Some(a) = authorization {
        req = req.header(http::header::AUTHORIZATION, a);
    }
    let body = match body {
        Some(b) => {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
            Full::new(Bytes::from(b.to_string()))
        }
        None => Full::new(Bytes::new()),
    };
    let resp = sender.send_request(req.body(body).unwrap()).await.unwrap();
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (code, String::from_utf8_lossy(&bytes).into_owned())
}

fn ns(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

async fn exists(server: &apiserver::RunningApiServer, name: &str) -> bool {
    let api: Api<Namespace> = Api::all(server.client());
    api.get_opt(name).await.unwrap().is_some()
}

#[tokio::test]
async fn anonymous_and_wrong_tokens_get_401_and_create_nothing() {
    let server = apiserver::ApiServer::start(apiserver::Config::default())
        .await
        .unwrap();
    let host = server.addr().to_string();
    // Anonymous create: 401 with kube-apiserver's Status, nothing created.
    let (code, body) = raw(
        &server,
        "POST",
        "/api/v1/namespaces",
        &host,
        None,
        Some(ns("anon")),
    )
    .await;
    assert_eq!(code, 401, "{body}");
    let status: Value = serde_json::from_str(&body).unwrap();
    let want: Value = serde_json::from_str(UNAUTHORIZED).unwrap();
    assert_eq!(status, want);
    assert!(!exists(&server, "anon").await);

    // A browser on a rebound name sends no token: 401 too.
    let (code, _) = raw(
        &server,
        "GET",
        "/api/v1/namespaces",
        "evil.example.com",
        None,
        None,
    )
    .await;
    assert_eq!(code, 401);

    // Wrong token, other schemes: 401.
    for auth in ["Bearer not-a-token", "Basic YWRtaW46YWRtaW4=", "Bearer"] {
        let (code, body) = raw(
            &server,
            "POST",
            "/api/v1/namespaces",
            &host,
            Some(auth),
            Some(ns("wrong")),
        )
        .await;
        assert_eq!(code, 401, "{auth}: {body}");
    }
    assert!(!exists(&server, "wrong").await);

    // Health and version are closed to anonymous callers as well (anonymous auth off).
    for path in [
        "/healthz", "/livez", "/readyz", "/version", "/api", "/metrics",
    ] {
        let (code, _) = raw(&server, "GET", path, &host, None, None).await;
        assert_eq!(code, 401, "{path}");
    }

    // The kubeconfig's token works.
    let token = kubeconfig_token(&server.kubeconfig_yaml());
    let bearer = format!("Bearer {token}");
    let (code, body) = raw(
        &server,
        "POST",
        "/api/v1/namespaces",
        &host,
        Some(&bearer),
        Some(ns("ok")),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    assert!(exists(&server, "ok").await);
    let (code, body) = raw(&server, "GET", "/healthz", &host, Some(&bearer), None).await;
    assert_eq!((code, body.as_str()), (200, "ok"));
}

#[tokio::test]
async fn the_serving_certificate_verifies_only_against_its_own_ca() {
    let a = apiserver::ApiServer::start(apiserver::Config::default())
        .await
        .unwrap();
    let b = apiserver::ApiServer::start(apiserver::Config::default())
        .await
        .unwrap();
    assert!(a.url().starts_with("https://127.0.0.1:"), "{}", a.url());
    assert_eq!(
        kubeconfig_ca(&a.kubeconfig_yaml()),
        CertificateDer::from_pem_slice(a.ca_pem().as_bytes()).unwrap()
    );
    tls_connect(&a, kubeconfig_ca(&a.kubeconfig_yaml()))
        .await
        .unwrap();
    // Another server's CA does not vouch for this one.
    let err = tls_connect(&a, kubeconfig_ca(&b.kubeconfig_yaml()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("certificate"), "{err}");

    // Plain HTTP is not spoken.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(a.addr()).await.unwrap();
    tcp.write_all(b"GET /api HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ =
        tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read_to_end(&mut buf)).await;
    assert!(!String::from_utf8_lossy(&buf).contains("HTTP/1.1 200"));
}

#[tokio::test]
async fn each_user_has_its_own_token_and_the_audit_names_it() {
    let server = apiserver::ApiServer::start(apiserver::Config::default())
        .await
        .unwrap();
    let yaml = server.kubeconfig_yaml_for("system:node:n1").unwrap();
    assert_ne!(
        kubeconfig_token(&yaml),
        kubeconfig_token(&server.kubeconfig_yaml())
    );
    // Same user, same token.
    assert_eq!(
        kubeconfig_token(&yaml),
        kubeconfig_token(&server.kubeconfig_yaml_for("system:node:n1").unwrap())
    );
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let node_client = kube::Client::try_from(config).unwrap();
    let api: Api<Namespace> = Api::all(node_client);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(ns("by-node")).unwrap(),
    )
    .await
    .unwrap();
    let admin: Api<Namespace> = Api::all(server.client());
    admin
        .create(
            &PostParams::default(),
            &serde_json::from_value(ns("by-admin")).unwrap(),
        )
        .await
        .unwrap();
    let mut creators: Vec<String> = server
        .audit()
        .into_iter()
        .filter(|r| r.verb == "create" && r.resource == "namespaces")
        .map(|r| r.user.to_string())
        .collect();
    creators.sort();
    assert_eq!(creators, vec![apiserver::ADMIN_USER, "system:node:n1"]);
}

#[tokio::test]
async fn kubeconfig_is_private_and_tokens_and_ca_survive_a_restart() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("kubeconfig");
    // A pre-existing world-readable file is tightened.
    std::fs::write(&out, "old").unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = apiserver::Config {
        data_dir: Some(dir.path().join("data")),
        kubeconfig_out: Some(out.clone()),
        ..Default::default()
    };
    let first = apiserver::ApiServer::start(config.clone()).await.unwrap();
    let mode = std::fs::metadata(&out).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let admin_yaml = std::fs::read_to_string(&out).unwrap();
    let node_yaml = first.kubeconfig_yaml_for("csi-node-agent").unwrap();
    first.shutdown().await.unwrap();

    let second = apiserver::ApiServer::start(config).await.unwrap();
    assert_eq!(
        kubeconfig_ca(&admin_yaml),
        kubeconfig_ca(&second.kubeconfig_yaml())
    );
    assert_eq!(
        kubeconfig_token(&admin_yaml),
        kubeconfig_token(&second.kubeconfig_yaml())
    );
    let node_token = format!("Bearer {}", kubeconfig_token(&node_yaml));
    let host = second.addr().to_string();
    let (code, body) = raw(
        &second,
        "GET",
        "/api/v1/namespaces",
        &host,
        Some(&node_token),
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    for f in ["pki/server.key", "tokens.csv"] {
        let mode = std::fs::metadata(dir.path().join("data").join(f))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
}

#[tokio::test]
async fn a_user_minted_with_groups_keeps_them_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = apiserver::Config {
        data_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let first = apiserver::ApiServer::start(config.clone()).await.unwrap();
    let yaml = first
        .kubeconfig_yaml_for_member("system:node:n1", &["system:nodes"])
        .unwrap();
    let token = kubeconfig_token(&yaml);
    // The kubeconfig names the user (quoted: it holds colons).
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    assert_eq!(kc.auth_infos[0].name, "system:node:n1");
    // Asked again: the same token.
    assert_eq!(
        kubeconfig_token(
            &first
                .kubeconfig_yaml_for_member("system:node:n1", &["system:nodes"])
                .unwrap()
        ),
        token
    );
    let alice = kubeconfig_token(&first.kubeconfig_yaml_for("alice").unwrap());
    first.shutdown().await.unwrap();

    // Kept as `--token-auth-file` lines: the user with its groups, the other with none.
    let kept = std::fs::read_to_string(dir.path().join("tokens.csv")).unwrap();
    let line = |t: &str| {
        kept.lines()
            .find(|l| l.starts_with(&format!("{t},")))
            .unwrap_or_else(|| panic!("{t} not in {kept}"))
            .to_string()
    };
    let node = line(&token);
    assert!(
        node.starts_with(&format!("{token},system:node:n1,")),
        "{node}"
    );
    assert!(node.ends_with(",\"system:nodes\""), "{node}");
    assert!(line(&alice).ends_with(",\"\""), "{}", line(&alice));

    // After a restart the token still authenticates (a 401 otherwise) and the audit names it.
    let second = apiserver::ApiServer::start(config).await.unwrap();
    let host = second.addr().to_string();
    let (code, body) = raw(
        &second,
        "POST",
        "/api/v1/namespaces",
        &host,
        Some(&format!("Bearer {token}")),
        Some(ns("by-n1")),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let creators: Vec<String> = second
        .audit()
        .into_iter()
        .filter(|r| r.verb == "create" && r.resource == "namespaces")
        .map(|r| r.user.to_string())
        .collect();
    assert_eq!(creators, vec!["system:node:n1"]);
}

#[tokio::test]
async fn token_auth_file_users_authenticate() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.csv");
    std::fs::write(&file, "# comment\ns3cret,alice,1001,\"devs,ops\"\n").unwrap();
    let server = apiserver::ApiServer::start(apiserver::Config {
        token_auth_file: Some(file),
        ..Default::default()
    })
    .await
    .unwrap();
    let host = server.addr().to_string();
    let (code, body) = raw(
        &server,
        "POST",
        "/api/v1/namespaces",
        &host,
        Some("Bearer s3cret"),
        Some(ns("alices")),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let users: Vec<String> = server
        .audit()
        .into_iter()
        .filter(|r| r.verb == "create")
        .map(|r| r.user.to_string())
        .collect();
    assert_eq!(users, vec!["alice".to_string()]);
}

/// The fixtures a test of another crate starts from: a client config whose User-Agent the audit trail
/// shows, and a private kubeconfig file that a process started with `--kubeconfig` can use.
#[tokio::test]
async fn a_client_as_a_user_agent_is_audited_as_it_and_the_kubeconfig_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let server = apiserver::ApiServer::start(apiserver::Config::default())
        .await
        .unwrap();
    let client =
        kube::Client::try_from(server.kube_config_as("my-controller/v1").unwrap()).unwrap();
    Api::<Namespace>::all(client)
        .create(
            &PostParams::default(),
            &serde_json::from_value(ns("ua")).unwrap(),
        )
        .await
        .unwrap();
    let create = server
        .audit()
        .into_iter()
        .find(|r| r.verb.as_str() == "create" && r.resource.as_str() == "namespaces")
        .unwrap();
    assert_eq!(create.user_agent.as_str(), "my-controller/v1");
    assert_eq!(create.user.as_str(), apiserver::ADMIN_USER);
    assert!(server.kube_config_as("bad\nagent").is_err());

    let dir = tempfile::tempdir().unwrap();
    let path = server.write_kubeconfig(dir.path()).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let from_file = kube::Client::try_from(config).unwrap();
    assert!(
        Api::<Namespace>::all(from_file)
            .get_opt("ua")
            .await
            .unwrap()
            .is_some()
    );

    // A write that cannot be put in place fails and leaves no copy of the token behind.
    let blocked = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(blocked.path().join("kubeconfig/in-the-way")).unwrap();
    assert!(server.write_kubeconfig(blocked.path()).is_err());
    let left: Vec<_> = std::fs::read_dir(blocked.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["kubeconfig"], "only the directory in the way stays");
}
