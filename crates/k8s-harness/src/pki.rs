//! The cluster's PKI, made per run with the `openssl` CLI (P-256 keys, valid two days): one CA
//! that signs the API server's serving cert and every client cert (admin, controller manager,
//! scheduler, kubelet, users a test asks for), and the service-account signing key.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug)]
pub(crate) struct Pki {
    dir: PathBuf,
    openssl: PathBuf,
    pub(crate) ca: CertFiles,
}

impl Pki {
    pub(crate) fn create(dir: &Path, openssl: PathBuf) -> Result<Pki, Error> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let ca = CertFiles {
            cert: dir.join("ca.crt"),
            key: dir.join("ca.key"),
        };
        let mut cmd = Command::new(&openssl);
        cmd.args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-subj", "/CN=csi-rs-test-ca"])
        .arg("-keyout")
        .arg(&ca.key)
        .arg("-out")
        .arg(&ca.cert)
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args([
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        ]);
        run(cmd)?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            openssl,
            ca,
        })
    }

    /// A cert signed by the CA for `CN=common_name`, `O=` each of `groups`; a serving cert
    /// when `sans` is not empty (entries as openssl writes them: `IP:127.0.0.1`, `DNS:x`).
    /// Files `<file_stem>.crt` / `.key`.
    pub(crate) fn issue(
        &self,
        file_stem: &str,
        common_name: &str,
        groups: &[&str],
        sans: &[&str],
    ) -> Result<CertFiles, Error> {
        for part in std::iter::once(&common_name).chain(groups) {
            if part.is_empty() || part.contains(['/', '\\', '=', '+', ',', '\n']) {
                return Err(Error::Invalid(format!(
                    "certificate subject part {part:?} (user or group name) is empty or has one of / \\ = + , newline"
                )));
            }
        }
        let files = CertFiles {
            cert: self.dir.join(format!("{file_stem}.crt")),
            key: self.dir.join(format!("{file_stem}.key")),
        };
        let subject: String = groups.iter().map(|g| format!("/O={g}")).collect::<String>()
            + &format!("/CN={common_name}");
        let mut cmd = Command::new(&self.openssl);
        cmd.args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-subj", &subject])
        .arg("-CA")
        .arg(&self.ca.cert)
        .arg("-CAkey")
        .arg(&self.ca.key)
        .arg("-keyout")
        .arg(&files.key)
        .arg("-out")
        .arg(&files.cert)
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .args(["-addext", "keyUsage=critical,digitalSignature"]);
        if sans.is_empty() {
            cmd.args(["-addext", "extendedKeyUsage=clientAuth"]);
        } else {
            cmd.args(["-addext", "extendedKeyUsage=serverAuth,clientAuth"])
                .arg("-addext")
                .arg(format!("subjectAltName={}", sans.join(",")));
        }
        run(cmd)?;
        Ok(files)
    }

    /// The service-account token signing key pair: (private key, public key).
    pub(crate) fn service_account_keys(&self) -> Result<(PathBuf, PathBuf), Error> {
        let key = self.dir.join("sa.key");
        let public = self.dir.join("sa.pub");
        let mut genkey = Command::new(&self.openssl);
        genkey
            .args([
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
            ])
            .arg(&key);
        run(genkey)?;
        let mut pubout = Command::new(&self.openssl);
        pubout
            .args(["pkey", "-pubout", "-in"])
            .arg(&key)
            .arg("-out")
            .arg(&public);
        run(pubout)?;
        Ok((key, public))
    }
}

/// Runs a short command to completion; a non-zero exit is [`Error::Command`] with its stderr.
pub(crate) fn run(mut cmd: Command) -> Result<std::process::Output, Error> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| Error::io(format!("running {shown}"), e))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: shown,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}
