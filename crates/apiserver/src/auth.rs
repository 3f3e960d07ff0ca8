//! TLS and authentication, as kube-apiserver does them with `--anonymous-auth=false`: the server
//! mints its own CA and a serving certificate for 127.0.0.1/::1/localhost, and every request
//! must carry a bearer token it knows (`--token-auth-file` format); anything else is answered
//! 401 with the `Unauthorized` Status, health and version paths included.
//!
//! Each user gets its own token ([`crate::RunningApiServer::kubeconfig_yaml_for`]), so the
//! audit trail names who wrote what. With a data directory the PKI (`pki/`) and the minted
//! tokens (`tokens.csv`) are kept there (mode 0600), so kubeconfigs stay valid across restarts.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use rand::RngCore;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::Error;

/// The user of [`crate::RunningApiServer::client`] and `kubeconfig_yaml`: kubeadm's admin
/// (group `system:masters`).
pub const ADMIN_USER: &str = "kubernetes-admin";

/// Who a request is from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

/// The CA clients trust and the serving configuration signed by it.
pub(crate) struct Pki {
    pub ca_pem: String,
    pub ca_der: Vec<u8>,
    pub server: Arc<rustls::ServerConfig>,
}

fn pki_err(reason: impl std::fmt::Display) -> Error {
    Error::Pki(reason.to_string())
}

/// Writes `data` to `path` readable by its owner only (keys, tokens, kubeconfigs), tightening
/// the mode of a file that was there; for whoever writes a client's credentials, csi-cluster
/// too.
pub fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::fs::PermissionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // An existing file keeps its mode on open: tighten it.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(data)
}

impl Pki {
    /// Loads `dir/pki/{ca.crt,server.crt,server.key}` when present, else mints new ones (and
    /// keeps them there when `dir` is given).
    pub fn load_or_mint(dir: Option<&Path>, listen: IpAddr) -> Result<Pki, Error> {
        let paths = dir.map(|d| {
            let p = d.join("pki");
            (
                p.clone(),
                p.join("ca.crt"),
                p.join("server.crt"),
                p.join("server.key"),
            )
        });
        if let Some((_, ca, crt, key)) = &paths {
            if ca.exists() && crt.exists() && key.exists() {
                let read = |p: &PathBuf| {
                    std::fs::read_to_string(p).map_err(|e| pki_err(format!("{}: {e}", p.display())))
                };
                return Self::from_pem(read(ca)?, &read(crt)?, &read(key)?);
            }
        }
        let (ca_pem, crt_pem, key_pem) = mint(listen)?;
        if let Some((pki_dir, ca, crt, key)) = &paths {
            std::fs::create_dir_all(pki_dir)
                .map_err(|e| pki_err(format!("{}: {e}", pki_dir.display())))?;
            for (p, data) in [(ca, &ca_pem), (crt, &crt_pem), (key, &key_pem)] {
                write_private(p, data.as_bytes())
                    .map_err(|e| pki_err(format!("{}: {e}", p.display())))?;
            }
        }
        Self::from_pem(ca_pem, &crt_pem, &key_pem)
    }

    fn from_pem(ca_pem: String, crt_pem: &str, key_pem: &str) -> Result<Pki, Error> {
        let ca_der = CertificateDer::from_pem_slice(ca_pem.as_bytes())
            .map_err(|e| pki_err(format!("CA certificate: {e}")))?
            .to_vec();
        let chain = vec![
            CertificateDer::from_pem_slice(crt_pem.as_bytes())
                .map_err(|e| pki_err(format!("serving certificate: {e}")))?,
        ];
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| pki_err(format!("serving key: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(pki_err)?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(pki_err)?;
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Pki {
            ca_pem,
            ca_der,
            server: Arc::new(server),
        })
    }
}

/// A new CA and a serving certificate signed by it: (CA cert, serving cert, serving key) PEM.
fn mint(listen: IpAddr) -> Result<(String, String, String), Error> {
    let now = jiff::Timestamp::now().as_second();
    let mut ca = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("apiserver-lite-ca@{now}"));
    ca.distinguished_name = dn;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().map_err(pki_err)?;
    let ca_cert = ca.self_signed(&ca_key).map_err(pki_err)?;
    let issuer = Issuer::new(ca, ca_key);

    let mut sans = vec![
        SanType::DnsName("localhost".try_into().map_err(pki_err)?),
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)),
    ];
    if !listen.is_unspecified() && !listen.is_loopback() {
        sans.push(SanType::IpAddress(listen));
    }
    let mut leaf = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "apiserver-lite");
    leaf.distinguished_name = dn;
    leaf.subject_alt_names = sans;
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    // Python 3.13's default context verifies strictly (X509_STRICT): it wants the AKI.
    leaf.use_authority_key_identifier_extension = true;
    let leaf_key = KeyPair::generate().map_err(pki_err)?;
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).map_err(pki_err)?;
    Ok((ca_cert.pem(), leaf_cert.pem(), leaf_key.serialize_pem()))
}

/// The audiences of the API server itself (kube-apiserver's `--api-audiences`, which defaults
/// to its `--service-account-issuer`; this is kubeadm's and the test harness's issuer): a
/// TokenRequest without audiences gets these, and only a token issued for one of them is
/// accepted by the API server.
pub(crate) const API_AUDIENCES: &[&str] = &["https://kubernetes.default.svc.cluster.local"];

/// What a token issued through the TokenRequest API (`serviceaccounts/<name>/token`) is
/// limited to: it authenticates as its ServiceAccount until `expires`, only for the API
/// audiences, and only while its ServiceAccount (and the pod it is bound to) still exist with
/// the same uid, as kube-apiserver's service-account authenticator checks (the handlers check
/// those objects). Kept in memory
/// only (a restart forgets them; their holders ask for new ones, as the kubelet does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BoundToken {
    pub expires: jiff::Timestamp,
    pub audiences: Vec<String>,
    pub namespace: String,
    pub service_account: String,
    pub service_account_uid: String,
    /// The object it is bound to: (kind `Pod` or `Secret`, name, uid).
    pub bound: Option<(String, String, String)>,
}

#[derive(Debug)]
struct Entry {
    user: UserInfo,
    bound: Option<BoundToken>,
}

/// Bearer tokens and whom they stand for.
#[derive(Debug)]
pub(crate) struct Tokens {
    by_token: Mutex<HashMap<String, Entry>>,
    /// Minted tokens are appended here (when the server has a data directory).
    file: Option<PathBuf>,
}

impl Tokens {
    /// Tokens from `token_file` (read-only, `--token-auth-file`) and from `data_dir/tokens.csv`
    /// (the ones minted before a restart).
    pub fn load(token_file: Option<&Path>, data_dir: Option<&Path>) -> Result<Tokens, Error> {
        let mut by_token = HashMap::new();
        let file = data_dir.map(|d| d.join("tokens.csv"));
        for path in token_file.iter().copied().chain(file.as_deref()) {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && Some(path) != token_file => {
                    continue;
                }
                Err(e) => return Err(pki_err(format!("{}: {e}", path.display()))),
            };
            for (n, line) in text.lines().enumerate() {
                if line.trim().is_empty() || line.trim_start().starts_with('#') {
                    continue;
                }
                let (token, user) = parse_token_line(line).ok_or_else(|| {
                    pki_err(format!(
                        "{} line {}: want token,user,uid[,\"group1,group2\"]",
                        path.display(),
                        n + 1
                    ))
                })?;
                by_token.insert(token, Entry { user, bound: None });
            }
        }
        Ok(Tokens {
            by_token: Mutex::new(by_token),
            file,
        })
    }

    /// Whom `token` stands for at `now`, and what an issued token is bound to (the caller
    /// checks that those objects still exist). An expired issued token is forgotten; one
    /// issued for other audiences is not accepted here (it is meant for someone else).
    pub fn authenticate(
        &self,
        token: &str,
        now: jiff::Timestamp,
    ) -> Option<(UserInfo, Option<BoundToken>)> {
        let mut map = self.by_token.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = map.get(token)?;
        if let Some(b) = &entry.bound {
            if b.expires <= now {
                map.remove(token);
                return None;
            }
            if !b
                .audiences
                .iter()
                .any(|a| API_AUDIENCES.contains(&a.as_str()))
            {
                return None;
            }
        }
        Some((entry.user.clone(), entry.bound.clone()))
    }

    /// A new token for ServiceAccount `bound.namespace/bound.service_account` (a
    /// TokenRequest), valid as [`BoundToken`] says. Expired tokens are dropped on the way.
    pub fn issue(&self, bound: BoundToken) -> String {
        let token = random_token();
        let user = UserInfo {
            name: format!(
                "system:serviceaccount:{}:{}",
                bound.namespace, bound.service_account
            ),
            uid: bound.service_account_uid.clone(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{}", bound.namespace),
                "system:authenticated".into(),
            ],
        };
        let mut map = self.by_token.lock().unwrap_or_else(PoisonError::into_inner);
        let now = jiff::Timestamp::now();
        map.retain(|_, e| e.bound.as_ref().is_none_or(|b| b.expires > now));
        map.insert(
            token.clone(),
            Entry {
                user,
                bound: Some(bound),
            },
        );
        token
    }

    /// The token of `user` (minted, and kept in the data directory, on first use).
    pub fn token_for(&self, user: &str, groups: &[&str]) -> Result<String, Error> {
        let mut map = self.by_token.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((t, _)) = map
            .iter()
            .find(|(_, e)| e.bound.is_none() && e.user.name == user)
        {
            return Ok(t.clone());
        }
        let token = random_token();
        let info = UserInfo {
            name: user.to_string(),
            uid: uuid::Uuid::new_v4().to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        };
        if let Some(path) = &self.file {
            let mut text = std::fs::read_to_string(path).unwrap_or_default();
            text.push_str(&format!(
                "{token},{},{},\"{}\"\n",
                info.name,
                info.uid,
                info.groups.join(",")
            ));
            write_private(path, text.as_bytes())
                .map_err(|e| pki_err(format!("{}: {e}", path.display())))?;
        }
        map.insert(
            token.clone(),
            Entry {
                user: info,
                bound: None,
            },
        );
        Ok(token)
    }
}

/// 32 random bytes, hex.
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `token,user,uid[,"group1,group2"]`, as kube-apiserver's `--token-auth-file`.
fn parse_token_line(line: &str) -> Option<(String, UserInfo)> {
    let mut parts = line.splitn(4, ',');
    let token = parts.next()?.trim();
    let name = parts.next()?.trim();
    let uid = parts.next()?.trim();
    if token.is_empty() || name.is_empty() {
        return None;
    }
    let groups = parts
        .next()
        .map(|g| {
            g.trim()
                .trim_matches('"')
                .split(',')
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Some((
        token.to_string(),
        UserInfo {
            name: name.to_string(),
            uid: uid.to_string(),
            groups,
        },
    ))
}

/// The bearer token of an `Authorization` header value.
pub(crate) fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file_lines() {
        let (t, u) = parse_token_line("abc,alice,42,\"system:masters,devs\"").unwrap();
        assert_eq!(t, "abc");
        assert_eq!(u.name, "alice");
        assert_eq!(u.uid, "42");
        assert_eq!(u.groups, vec!["system:masters", "devs"]);
        assert!(parse_token_line("abc,alice").is_none());
        assert_eq!(bearer("Bearer  xyz"), Some("xyz"));
        assert_eq!(bearer("Basic xyz"), None);
        assert_eq!(bearer("Bearer "), None);
    }

    #[test]
    fn minted_tokens_survive_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::load(None, Some(dir.path())).unwrap();
        let t = tokens.token_for("alice", &["g"]).unwrap();
        assert_eq!(tokens.token_for("alice", &["g"]).unwrap(), t);
        let again = Tokens::load(None, Some(dir.path())).unwrap();
        let now = jiff::Timestamp::now();
        assert_eq!(again.authenticate(&t, now).unwrap().0.name, "alice");
        assert!(again.authenticate("nope", now).is_none());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("tokens.csv"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn issued_tokens_expire_and_serve_only_the_api_audiences() {
        let tokens = Tokens::load(None, None).unwrap();
        let now = jiff::Timestamp::now();
        let bound = |audience: &str, secs: i64| BoundToken {
            expires: now + jiff::SignedDuration::from_secs(secs),
            audiences: vec![audience.to_string()],
            namespace: "ns".into(),
            service_account: "sa".into(),
            service_account_uid: "u1".into(),
            bound: None,
        };
        let t = tokens.issue(bound(API_AUDIENCES[0], 600));
        let (user, b) = tokens.authenticate(&t, now).unwrap();
        assert_eq!(user.name, "system:serviceaccount:ns:sa");
        assert_eq!(user.uid, "u1");
        assert_eq!(
            user.groups,
            vec![
                "system:serviceaccounts",
                "system:serviceaccounts:ns",
                "system:authenticated"
            ]
        );
        assert_eq!(b.unwrap().service_account, "sa");
        let later = now + jiff::SignedDuration::from_secs(601);
        assert!(tokens.authenticate(&t, later).is_none(), "expired");
        assert!(
            tokens.authenticate(&t, now).is_none(),
            "forgotten once expired"
        );
        let vault = tokens.issue(bound("vault", 600));
        assert!(tokens.authenticate(&vault, now).is_none(), "not for us");
        // A user's own token is never an issued one.
        let admin = tokens
            .token_for("system:serviceaccount:ns:sa", &[])
            .unwrap();
        assert_ne!(admin, t);
    }
}
