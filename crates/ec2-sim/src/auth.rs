//! AWS Signature Version 4: the credentials the simulator accepts, the check of every EC2
//! request against them, and a signer for clients that do not have an SDK (tests, raw HTTP).
//!
//! The check follows AWS's documented algorithm: parse `Authorization: AWS4-HMAC-SHA256
//! Credential=AKID/DATE/REGION/ec2/aws4_request, SignedHeaders=..., Signature=...`, rebuild the
//! canonical request (method, URI, query, the signed headers, the SHA-256 of the body as
//! received) and the string to sign (with `X-Amz-Date`), derive the signing key from the secret
//! and compare the signatures in constant time.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::Error;
use crate::xml::ApiError;

type HmacSha256 = Hmac<Sha256>;

/// The access key ID [`Credentials::default`] accepts (what the workspace's tests sign with).
pub const DEFAULT_ACCESS_KEY_ID: &str = "AKIDTEST";
/// The secret of [`DEFAULT_ACCESS_KEY_ID`].
pub const DEFAULT_SECRET_ACCESS_KEY: &str = "secret";
/// The file under the state dir where [`Credentials::load_or_generate`] keeps its pair.
pub const CREDENTIALS_FILE: &str = "credentials";

/// How far `X-Amz-Date` may be from the simulator's clock, as AWS allows.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(15 * 60);

const ALGORITHM: &str = "AWS4-HMAC-SHA256";
const SERVICE: &str = "ec2";

/// Access key IDs and their secrets: who may call the simulator's EC2 endpoint.
///
/// `Debug` shows the key IDs only.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    keys: BTreeMap<String, String>,
}

impl Default for Credentials {
    /// The well-known test pair [`DEFAULT_ACCESS_KEY_ID`] / [`DEFAULT_SECRET_ACCESS_KEY`].
    fn default() -> Self {
        Credentials::single(DEFAULT_ACCESS_KEY_ID, DEFAULT_SECRET_ACCESS_KEY)
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_ids", &self.keys.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// No keys at all (add some with [`Credentials::insert`]; an empty set is refused at start).
    pub fn empty() -> Self {
        Credentials {
            keys: BTreeMap::new(),
        }
    }

    /// Exactly one pair.
    pub fn single(access_key_id: impl Into<String>, secret: impl Into<String>) -> Self {
        let mut c = Credentials::empty();
        c.insert(access_key_id, secret);
        c
    }

    /// Adds (or replaces) a pair.
    pub fn insert(&mut self, access_key_id: impl Into<String>, secret: impl Into<String>) {
        self.keys.insert(access_key_id.into(), secret.into());
    }

    /// The secret of `access_key_id`, if it is one of these.
    pub fn secret(&self, access_key_id: &str) -> Option<&str> {
        self.keys.get(access_key_id).map(String::as_str)
    }

    /// The pair with the smallest key ID (the only one, usually): what a client of the
    /// simulator should sign with.
    pub fn first(&self) -> Option<(&str, &str)> {
        self.keys
            .iter()
            .next()
            .map(|(k, s)| (k.as_str(), s.as_str()))
    }

    /// Every access key ID.
    pub fn access_key_ids(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// A fresh random pair from the OS's cryptographic generator: an `AKIA`-style key ID of
    /// 20 characters and a 40-character secret.
    pub fn generate() -> Self {
        use rand::Rng as _;
        use rand::distr::Alphanumeric;
        const ID_CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
        let mut rng = rand::rng();
        let id: String = std::iter::once("AKIA".to_string())
            .chain((0..16).map(|_| {
                let i = rng.random_range(0..ID_CHARS.len());
                char::from(ID_CHARS[i]).to_string()
            }))
            .collect();
        let secret: String = (0..40)
            .map(|_| char::from(rng.sample(Alphanumeric)))
            .collect();
        Credentials::single(id, secret)
    }

    /// Parses an AWS shared-credentials file (`~/.aws/credentials` format): every profile's
    /// `aws_access_key_id` / `aws_secret_access_key` pair is accepted.
    pub fn from_shared_credentials(text: &str) -> Result<Self, Error> {
        let mut creds = Credentials::empty();
        let mut profile: Option<String> = None;
        let mut pending: (Option<String>, Option<String>) = (None, None);
        let mut finish = |profile: &Option<String>,
                          pending: &mut (Option<String>, Option<String>)|
         -> Result<(), Error> {
            match std::mem::take(pending) {
                (Some(id), Some(secret)) => {
                    creds.insert(id, secret);
                    Ok(())
                }
                (None, None) => Ok(()),
                _ => Err(Error::Config(format!(
                    "credentials: profile [{}] needs both aws_access_key_id and aws_secret_access_key",
                    profile.as_deref().unwrap_or("")
                ))),
            }
        };
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                finish(&profile, &mut pending)?;
                profile = Some(name.trim().to_string());
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                return Err(Error::Config(format!(
                    "credentials: line {}: expected `key = value` or `[profile]`",
                    n + 1
                )));
            };
            let value = value.trim().to_string();
            match key.trim().to_ascii_lowercase().as_str() {
                "aws_access_key_id" => pending.0 = Some(value),
                "aws_secret_access_key" => pending.1 = Some(value),
                _ => {}
            }
        }
        finish(&profile, &mut pending)?;
        if creds.is_empty() {
            return Err(Error::Config(
                "credentials: no aws_access_key_id / aws_secret_access_key pair".into(),
            ));
        }
        Ok(creds)
    }

    /// Reads an AWS shared-credentials file.
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Credentials::from_shared_credentials(&text)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }

    /// The AWS shared-credentials text of these pairs: the first as `[default]`, any others as
    /// `[ec2-sim-N]`.
    pub fn to_shared_credentials(&self) -> String {
        let mut out = String::new();
        for (i, (id, secret)) in self.keys.iter().enumerate() {
            if i == 0 {
                out.push_str("[default]\n");
            } else {
                out.push_str(&format!("\n[ec2-sim-{i}]\n"));
            }
            out.push_str(&format!(
                "aws_access_key_id = {id}\naws_secret_access_key = {secret}\n"
            ));
        }
        out
    }

    /// Writes [`Credentials::to_shared_credentials`] to `path`, readable by the owner only
    /// (mode 0600 from creation, so the secret is never world-readable).
    pub fn write_file(&self, path: &Path) -> Result<(), Error> {
        use std::os::unix::fs::OpenOptionsExt as _;
        use std::os::unix::fs::PermissionsExt as _;
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(|source| Error::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        // An existing file keeps its mode on open: make it 0600 too.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io)?;
        f.write_all(self.to_shared_credentials().as_bytes())
            .map_err(io)?;
        f.sync_all().map_err(io)
    }

    /// The credentials of a simulator whose user gave none: those in
    /// `state_dir/credentials` if the file exists (so a restart keeps them), else a new random
    /// pair written there (0600). Returns them, the file, and whether they are new.
    pub fn load_or_generate(state_dir: &Path) -> Result<(Self, PathBuf, bool), Error> {
        let path = state_dir.join(CREDENTIALS_FILE);
        if path.exists() {
            return Ok((Credentials::from_file(&path)?, path, false));
        }
        let creds = Credentials::generate();
        creds.write_file(&path)?;
        Ok((creds, path, true))
    }
}

/// Headers that sign a form `POST /` with `body` to `host` (`127.0.0.1:PORT`, as the client
/// sends it in `Host`) for `region`'s EC2 at time `now`: add `X-Amz-Date` and `Authorization`
/// (both returned, in that order) to the request. The signed headers are `host` and
/// `x-amz-date`.
pub fn sign_post(
    host: &str,
    body: &[u8],
    region: &str,
    access_key_id: &str,
    secret: &str,
    now: SystemTime,
) -> [(&'static str, String); 2] {
    sign_request(
        "POST",
        "/",
        "",
        host,
        body,
        region,
        access_key_id,
        secret,
        now,
    )
}

/// Like [`sign_post`] for any method, path (as sent, percent-encoded) and raw query string
/// (without `?`), e.g. `GET /?Action=DescribeVolumes&Version=2016-11-15`.
#[allow(clippy::too_many_arguments)]
pub fn sign_request(
    method: &str,
    path: &str,
    query: &str,
    host: &str,
    body: &[u8],
    region: &str,
    access_key_id: &str,
    secret: &str,
    now: SystemTime,
) -> [(&'static str, String); 2] {
    let amz_date = amz_date(now);
    let date = &amz_date[..8];
    let canonical = format!(
        "{method}\n{}\n{}\nhost:{}\nx-amz-date:{amz_date}\n\nhost;x-amz-date\n{}",
        canonical_uri(path),
        canonical_query(query),
        collapse_spaces(host),
        hex::encode(Sha256::digest(body))
    );
    let scope = format!("{date}/{region}/{SERVICE}/aws4_request");
    let to_sign = string_to_sign(&amz_date, &scope, &canonical);
    let signature = hex::encode(
        signing_mac(secret, date, region, &to_sign)
            .finalize()
            .into_bytes(),
    );
    [
        ("x-amz-date", amz_date),
        (
            "authorization",
            format!(
                "{ALGORITHM} Credential={access_key_id}/{scope}, SignedHeaders=host;x-amz-date, Signature={signature}"
            ),
        ),
    ]
}

/// The parts of one request the check needs.
pub(crate) struct Request<'a> {
    pub(crate) method: &'a str,
    /// The path as received (still percent-encoded).
    pub(crate) path: &'a str,
    /// The raw query string, without `?`.
    pub(crate) query: &'a str,
    pub(crate) headers: &'a HeaderMap,
    pub(crate) body: &'a [u8],
}

/// Checks one EC2 request's signature; returns the access key ID that signed it.
pub(crate) fn verify(
    creds: &Credentials,
    region: &str,
    req: &Request<'_>,
    now: SystemTime,
) -> Result<String, ApiError> {
    let Some(auth) = req.headers.get(http::header::AUTHORIZATION) else {
        return Err(auth_failure());
    };
    let auth = auth
        .to_str()
        .map_err(|_| incomplete("Authorization header is not ASCII"))?;
    let parsed = parse_authorization(auth)?;
    let Some(secret) = creds.secret(parsed.access_key_id) else {
        return Err(auth_failure());
    };

    let amz_date = match req.headers.get("x-amz-date") {
        Some(v) => v
            .to_str()
            .map_err(|_| incomplete("X-Amz-Date is not ASCII"))?,
        None => {
            return Err(incomplete(
                "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.",
            ));
        }
    };
    let Some(signed_at) = parse_amz_date(amz_date) else {
        return Err(incomplete(&format!(
            "Invalid X-Amz-Date '{amz_date}': expected the ISO 8601 basic format YYYYMMDD'T'HHMMSS'Z'"
        )));
    };
    let skew = match now.duration_since(signed_at) {
        Ok(past) => past,
        Err(future) => future.duration(),
    };
    if skew > MAX_CLOCK_SKEW {
        return Err(ApiError::new("RequestExpired", "Request has expired."));
    }
    if parsed.date != &amz_date[..8] {
        return Err(signature_mismatch_because(&format!(
            "Credential should be scoped to a valid date, not '{}' (X-Amz-Date is {amz_date}).",
            parsed.date
        )));
    }
    if parsed.region != region {
        return Err(signature_mismatch_because(&format!(
            "Credential should be scoped to a valid region, not '{}'.",
            parsed.region
        )));
    }
    if parsed.service != SERVICE {
        return Err(signature_mismatch_because(&format!(
            "Credential should be scoped to correct service: '{SERVICE}'."
        )));
    }

    let canonical = canonical_request(req, &parsed.signed_headers)?;
    let scope = format!("{}/{}/{SERVICE}/aws4_request", parsed.date, parsed.region);
    let to_sign = string_to_sign(amz_date, &scope, &canonical);
    let provided = hex::decode(parsed.signature).map_err(|_| signature_mismatch())?;
    // Constant time: `verify_slice` compares without returning early.
    signing_mac(secret, parsed.date, parsed.region, &to_sign)
        .verify_slice(&provided)
        .map_err(|_| signature_mismatch())?;
    Ok(parsed.access_key_id.to_string())
}

struct Authorization<'a> {
    access_key_id: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

fn parse_authorization(value: &str) -> Result<Authorization<'_>, ApiError> {
    let Some(rest) = value.trim().strip_prefix(ALGORITHM) else {
        let algorithm = value.split_whitespace().next().unwrap_or("");
        return Err(incomplete(&format!(
            "Unsupported authorization type '{algorithm}': only {ALGORITHM} (Signature Version 4) is accepted."
        )));
    };
    if !rest.starts_with(' ') {
        return Err(incomplete("Authorization header is malformed"));
    }
    let (mut credential, mut signed_headers, mut signature) = (None, None, None);
    for part in rest.split(',') {
        let Some((k, v)) = part.trim().split_once('=') else {
            return Err(incomplete(&format!(
                "Authorization header requires each component to be of the form key=value: '{}'",
                part.trim()
            )));
        };
        match k {
            "Credential" => credential = Some(v),
            "SignedHeaders" => signed_headers = Some(v),
            "Signature" => signature = Some(v),
            _ => {}
        }
    }
    let missing: Vec<&str> = [
        ("Credential", credential.is_none()),
        ("SignedHeaders", signed_headers.is_none()),
        ("Signature", signature.is_none()),
    ]
    .iter()
    .filter(|(_, m)| *m)
    .map(|(n, _)| *n)
    .collect();
    let (Some(credential), Some(signed_headers), Some(signature)) =
        (credential, signed_headers, signature)
    else {
        return Err(incomplete(&format!(
            "Authorization header requires '{}' parameter(s).",
            missing.join("', '")
        )));
    };
    let parts: Vec<&str> = credential.split('/').collect();
    let [access_key_id, date, region, service, terminator] = parts[..] else {
        return Err(incomplete(&format!(
            "Credential '{credential}' is malformed: expected 'ACCESS_KEY_ID/YYYYMMDD/REGION/SERVICE/aws4_request'."
        )));
    };
    if terminator != "aws4_request" || access_key_id.is_empty() {
        return Err(incomplete(&format!(
            "Credential '{credential}' is malformed: expected 'ACCESS_KEY_ID/YYYYMMDD/REGION/SERVICE/aws4_request'."
        )));
    }
    let signed_headers: Vec<&str> = signed_headers.split(';').collect();
    if !signed_headers.contains(&"host") {
        return Err(incomplete(
            "'Host' must be a signed header (SignedHeaders does not list host).",
        ));
    }
    Ok(Authorization {
        access_key_id,
        date,
        region,
        service,
        signed_headers,
        signature,
    })
}

fn canonical_request(req: &Request<'_>, signed_headers: &[&str]) -> Result<String, ApiError> {
    let mut out = String::with_capacity(256 + req.query.len());
    out.push_str(req.method);
    out.push('\n');
    out.push_str(&canonical_uri(req.path));
    out.push('\n');
    out.push_str(&canonical_query(req.query));
    out.push('\n');
    for name in signed_headers {
        let mut values = Vec::new();
        for v in req.headers.get_all(*name) {
            // Header values are bytes; non-UTF-8 ones go in as they are (lossy is fine: such a
            // request cannot have been signed over different text).
            values.push(collapse_spaces(&String::from_utf8_lossy(v.as_bytes())));
        }
        if values.is_empty() {
            return Err(signature_mismatch_because(&format!(
                "Signed header '{name}' is not in the request."
            )));
        }
        out.push_str(name);
        out.push(':');
        out.push_str(&values.join(","));
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&signed_headers.join(";"));
    out.push('\n');
    // The payload's hash is always the body's own: a client's X-Amz-Content-SHA256 that does
    // not match its body signs something else and fails.
    out.push_str(&hex::encode(Sha256::digest(req.body)));
    Ok(out)
}

/// Every segment of the path URI-encoded (again: EC2 is not S3, so the received, already
/// encoded, path is encoded a second time); `/` when empty.
fn canonical_uri(path: &str) -> String {
    if path.is_empty() || path == "/" {
        return "/".into();
    }
    path.split('/')
        .map(uri_encode)
        .collect::<Vec<_>>()
        .join("/")
}

/// Query parameters decoded, re-encoded the SigV4 way, sorted by name then value.
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (
                uri_encode(&percent_decode(k)),
                uri_encode(&percent_decode(v)),
            )
        })
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// RFC 3986 encoding: unreserved characters as they are, every other byte as `%XX`.
fn uri_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = bytes.get(i + 1..i + 3)
            && let Ok(hex) = std::str::from_utf8(hex)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Trimmed, with runs of spaces made one (SigV4's canonical header value).
fn collapse_spaces(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn string_to_sign(amz_date: &str, scope: &str, canonical_request: &str) -> String {
    format!(
        "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical_request.as_bytes()))
    )
}

fn hmac(key: &[u8], data: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    mac.update(data);
    mac
}

/// The MAC over `to_sign` with the key derived from `secret` for this date and region.
fn signing_mac(secret: &str, date: &str, region: &str, to_sign: &str) -> HmacSha256 {
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes()).finalize();
    let k_region = hmac(&k_date.into_bytes(), region.as_bytes()).finalize();
    let k_service = hmac(&k_region.into_bytes(), SERVICE.as_bytes()).finalize();
    let k_signing = hmac(&k_service.into_bytes(), b"aws4_request").finalize();
    hmac(&k_signing.into_bytes(), to_sign.as_bytes())
}

/// `YYYYMMDD'T'HHMMSS'Z'` of `t`.
pub(crate) fn amz_date(t: SystemTime) -> String {
    let ms = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    // 2024-05-01T12:34:56.789Z → 20240501T123456Z
    let iso = crate::ids::iso8601(ms);
    let mut out: String = iso[..19]
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    out.push('Z');
    out
}

/// The instant of an `X-Amz-Date` value.
fn parse_amz_date(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let digits = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let (y, m, d) = (digits(0..4)?, digits(4..6)?, digits(6..8)?);
    let (hh, mm, ss) = (digits(9..11)?, digits(11..13)?, digits(13..15)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let days = days_from_civil(y, m, d);
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    let secs = u64::try_from(secs).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// Howard Hinnant's civil-to-days algorithm (proleptic Gregorian calendar).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn auth_failure() -> ApiError {
    ApiError::new(
        "AuthFailure",
        "AWS was not able to validate the provided access credentials",
    )
}

fn incomplete(message: &str) -> ApiError {
    ApiError::new("IncompleteSignature", message)
}

fn signature_mismatch() -> ApiError {
    ApiError::new(
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details.",
    )
}

fn signature_mismatch_because(why: &str) -> ApiError {
    ApiError::new("SignatureDoesNotMatch", why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(headers: &'a HeaderMap, body: &'a [u8]) -> Request<'a> {
        Request {
            method: "POST",
            path: "/",
            query: "",
            headers,
            body,
        }
    }

    fn signed(
        host: &str,
        body: &[u8],
        region: &str,
        key: &str,
        secret: &str,
        at: SystemTime,
    ) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("host", host.parse().unwrap());
        h.insert(
            "content-type",
            "application/x-www-form-urlencoded; charset=utf-8"
                .parse()
                .unwrap(),
        );
        for (k, v) in sign_post(host, body, region, key, secret, at) {
            h.insert(k, v.parse().unwrap());
        }
        h
    }

    fn code(r: Result<String, ApiError>) -> String {
        r.map(|k| format!("ok {k}")).unwrap_or_else(|e| e.code)
    }

    /// AWS's published SigV4 example (IAM ListUsers, GET with a query string, the
    /// documentation's example key): our canonical request, string to sign and key derivation
    /// give its signature.
    #[test]
    fn aws_documented_example_signature() {
        let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
        let mut h = HeaderMap::new();
        h.insert(
            "content-type",
            "application/x-www-form-urlencoded; charset=utf-8"
                .parse()
                .unwrap(),
        );
        h.insert("host", "iam.amazonaws.com".parse().unwrap());
        h.insert("x-amz-date", "20150830T123600Z".parse().unwrap());
        let req = Request {
            method: "GET",
            path: "/",
            query: "Action=ListUsers&Version=2010-05-08",
            headers: &h,
            body: b"",
        };
        let canonical = canonical_request(&req, &["content-type", "host", "x-amz-date"]).unwrap();
        assert_eq!(
            hex::encode(Sha256::digest(canonical.as_bytes())),
            "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59",
            "{canonical}"
        );
        let to_sign = string_to_sign(
            "20150830T123600Z",
            "20150830/us-east-1/iam/aws4_request",
            &canonical,
        );
        // The example is for IAM; derive its key by hand (our signing_mac is EC2's).
        let k_date = hmac(format!("AWS4{secret}").as_bytes(), b"20150830").finalize();
        let k_region = hmac(&k_date.into_bytes(), b"us-east-1").finalize();
        let k_service = hmac(&k_region.into_bytes(), b"iam").finalize();
        let k_signing = hmac(&k_service.into_bytes(), b"aws4_request").finalize();
        let sig = hmac(&k_signing.into_bytes(), to_sign.as_bytes()).finalize();
        assert_eq!(
            hex::encode(sig.into_bytes()),
            "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    #[test]
    fn signed_post_verifies_and_each_tampering_is_caught() {
        let creds = Credentials::default();
        let now = SystemTime::now();
        let body = b"Action=DescribeVolumes&Version=2016-11-15";
        let h = signed("127.0.0.1:1", body, "us-east-1", "AKIDTEST", "secret", now);
        assert_eq!(
            code(verify(&creds, "us-east-1", &request(&h, body), now)),
            "ok AKIDTEST"
        );
        // Another body under the same header.
        let other = b"Action=DeleteVolume&Version=2016-11-15&VolumeId=vol-1234abcd";
        assert_eq!(
            code(verify(&creds, "us-east-1", &request(&h, other), now)),
            "SignatureDoesNotMatch"
        );
        // Another host.
        let mut h2 = h.clone();
        h2.insert("host", "127.0.0.1:2".parse().unwrap());
        assert_eq!(
            code(verify(&creds, "us-east-1", &request(&h2, body), now)),
            "SignatureDoesNotMatch"
        );
        // A wrong secret, an unknown key, no header at all.
        let h3 = signed("127.0.0.1:1", body, "us-east-1", "AKIDTEST", "nope", now);
        assert_eq!(
            code(verify(&creds, "us-east-1", &request(&h3, body), now)),
            "SignatureDoesNotMatch"
        );
        let h4 = signed("127.0.0.1:1", body, "us-east-1", "AKIDOTHER", "secret", now);
        assert_eq!(
            code(verify(&creds, "us-east-1", &request(&h4, body), now)),
            "AuthFailure"
        );
        let mut h5 = HeaderMap::new();
        h5.insert("host", "127.0.0.1:1".parse().unwrap());
        let e = verify(&creds, "us-east-1", &request(&h5, body), now).unwrap_err();
        assert_eq!((e.code.as_str(), e.status), ("AuthFailure", 401));
        // Another region's scope.
        let h6 = signed("127.0.0.1:1", body, "eu-west-1", "AKIDTEST", "secret", now);
        assert_eq!(
            code(verify(&creds, "us-east-1", &request(&h6, body), now)),
            "SignatureDoesNotMatch"
        );
    }

    #[test]
    fn requests_dated_beyond_fifteen_minutes_are_expired() {
        let creds = Credentials::default();
        let now = SystemTime::now();
        let body = b"Action=DescribeVolumes&Version=2016-11-15";
        for (offset, want) in [
            (Duration::from_secs(14 * 60), "ok AKIDTEST"),
            (Duration::from_secs(16 * 60), "RequestExpired"),
        ] {
            for at in [now - offset, now + offset] {
                let h = signed("h", body, "us-east-1", "AKIDTEST", "secret", at);
                assert_eq!(
                    code(verify(&creds, "us-east-1", &request(&h, body), now)),
                    want,
                    "{offset:?}"
                );
            }
        }
    }

    #[test]
    fn malformed_authorization_is_an_incomplete_signature() {
        let creds = Credentials::default();
        let now = SystemTime::now();
        for value in [
            "AWS AKIDTEST:abc",
            "AWS4-HMAC-SHA256 Credential=AKIDTEST/20240101/us-east-1/ec2/aws4_request",
            "AWS4-HMAC-SHA256 Credential=AKIDTEST/us-east-1/ec2, SignedHeaders=host, Signature=00",
            "AWS4-HMAC-SHA256 Credential=AKIDTEST/20240101/us-east-1/ec2/aws4_request, SignedHeaders=x-amz-date, Signature=00",
        ] {
            let mut h = HeaderMap::new();
            h.insert("host", "h".parse().unwrap());
            h.insert("x-amz-date", amz_date(now).parse().unwrap());
            h.insert("authorization", value.parse().unwrap());
            let e = verify(&creds, "us-east-1", &request(&h, b""), now).unwrap_err();
            assert_eq!(e.code, "IncompleteSignature", "{value}: {e:?}");
        }
    }

    #[test]
    fn dates_round_trip() {
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(amz_date(t), "20231114T221320Z");
        assert_eq!(parse_amz_date("20231114T221320Z"), Some(t));
        assert_eq!(
            parse_amz_date("20000229T000000Z"),
            Some(UNIX_EPOCH + Duration::from_secs(951_782_400))
        );
        assert_eq!(parse_amz_date("2023-11-14T22:13:20Z"), None);
        assert_eq!(parse_amz_date("20231314T221320Z"), None);
    }

    #[test]
    fn shared_credentials_round_trip_and_generated_pairs_differ() {
        let mut c = Credentials::single("AKIDONE", "s1");
        c.insert("AKIDTWO", "s2");
        let text = c.to_shared_credentials();
        assert_eq!(Credentials::from_shared_credentials(&text).unwrap(), c);
        let parsed = Credentials::from_shared_credentials(
            "# comment\n[default]\naws_access_key_id=A\naws_secret_access_key = B\nregion = x\n",
        )
        .unwrap();
        assert_eq!(parsed.secret("A"), Some("B"));
        assert!(Credentials::from_shared_credentials("[p]\naws_access_key_id = A\n").is_err());
        assert!(Credentials::from_shared_credentials("").is_err());
        let (a, b) = (Credentials::generate(), Credentials::generate());
        assert_ne!(a, b);
        let (id, secret) = a.first().unwrap();
        assert_eq!((id.len(), secret.len()), (20, 40));
        assert!(id.starts_with("AKIA"));
        assert!(!format!("{a:?}").contains(secret));
    }

    #[test]
    fn generated_credentials_file_is_private_and_reused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let (c1, path, new) = Credentials::load_or_generate(dir.path()).unwrap();
        assert!(new);
        assert_eq!(path, dir.path().join("credentials"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (c2, _, new) = Credentials::load_or_generate(dir.path()).unwrap();
        assert!(!new);
        assert_eq!(c1, c2);
    }
}
