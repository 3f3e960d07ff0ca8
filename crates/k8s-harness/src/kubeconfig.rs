//! Kubeconfig files (JSON, which every kubeconfig reader accepts as YAML).

use std::path::Path;

use crate::Error;

/// How a kubeconfig's user authenticates.
pub(crate) enum Credentials<'a> {
    Cert { cert: &'a Path, key: &'a Path },
    Token(&'a str),
}

pub(crate) fn write(
    path: &Path,
    server: &str,
    ca: &Path,
    user: &str,
    credentials: Credentials<'_>,
) -> Result<(), Error> {
    let user_entry = match credentials {
        Credentials::Cert { cert, key } => serde_json::json!({
            "client-certificate": cert, "client-key": key,
        }),
        Credentials::Token(token) => serde_json::json!({ "token": token }),
    };
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "harness", "cluster": { "server": server, "certificate-authority": ca } }],
        "users": [{ "name": user, "user": user_entry }],
        "contexts": [{ "name": "harness", "context": { "cluster": "harness", "user": user } }],
        "current-context": "harness",
    });
    let text = serde_json::to_string_pretty(&doc)
        .map_err(|e| Error::Invalid(format!("kubeconfig for {user}: {e}")))?;
    std::fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}
