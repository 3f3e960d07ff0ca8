//! The path of an `aws://` volume ID as Go's `net/url.Parse` reads it.
//!
//! Upstream takes the EBS volume ID from `url.Parse(kubernetesID).Path`: the query and fragment
//! are cut off, the path is percent-decoded, and some IDs do not parse at all. The CSI volume
//! handle must be the one the Go components (external-attacher, kube-controller-manager) derive,
//! so this follows the same rules for the parts of a URL an `aws://` ID can have.

/// Characters Go accepts unescaped in a host (`shouldEscape(c, encodeHost)` is false).
fn host_char_ok(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"-_.~!$&'()*+,;=:[]<>\"".contains(&c)
}

/// Characters Go accepts in user information (`validUserinfo`).
fn userinfo_char_ok(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"-._:~!$&'()*+,;=%@".contains(&c)
}

/// Percent-decodes `s`; `None` for a malformed escape (Go: "invalid URL escape").
fn unescape(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let text = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(text, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// `":"` followed by digits, or nothing (Go's `validOptionalPort`).
fn valid_optional_port(port: &str) -> bool {
    port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| p.bytes().all(|c| c.is_ascii_digit()))
}

fn host_ok(host: &str) -> bool {
    if let Some(rest) = host.strip_prefix('[') {
        // An IPv6 literal, then an optional port.
        return rest
            .find(']')
            .is_some_and(|i| valid_optional_port(&rest[i + 1..]));
    }
    if let Some(i) = host.rfind(':') {
        if !valid_optional_port(&host[i..]) {
            return false;
        }
    }
    host.bytes().all(|c| c == b'%' || host_char_ok(c)) && unescape(host).is_some()
}

/// The decoded path of `url` (which starts with `aws://`), or `None` where Go's `url.Parse`
/// fails.
pub(crate) fn aws_url_path(url: &str) -> Option<String> {
    if url.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return None; // "invalid control character in URL"
    }
    let (rest, fragment) = url.split_once('#').unwrap_or((url, ""));
    unescape(fragment)?;
    let rest = rest.split_once('?').map_or(rest, |(r, _query)| r);
    let after = rest.strip_prefix("aws://")?;
    let (authority, path) = after.find('/').map_or((after, ""), |i| after.split_at(i));
    let host = match authority.rfind('@') {
        Some(i) => {
            if !authority[..i].bytes().all(userinfo_char_ok) {
                return None;
            }
            &authority[i + 1..]
        }
        None => authority,
    };
    if !host_ok(host) {
        return None;
    }
    String::from_utf8(unescape(path)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_as_go_parses_it() {
        for (url, path) in [
            ("aws:///vol-1", Some("/vol-1")),
            ("aws://us-east-1a/vol-1", Some("/vol-1")),
            ("aws://us-east-1a/vol-1?x=y", Some("/vol-1")),
            ("aws://us-east-1a/vol-1#frag", Some("/vol-1")),
            ("aws://z/vol-%31%2Fx", Some("/vol-1/x")),
            ("aws://z:443/vol-1", Some("/vol-1")),
            ("aws://user@z/vol-1", Some("/vol-1")),
            ("aws://[::1]:8/vol-1", Some("/vol-1")),
            ("aws://z", Some("")),
            ("aws://z/vol-%zz", None),
            ("aws://z/vol-1#%zz", None),
            ("aws://us east/vol-1", None),
            ("aws://z:abc/vol-1", None),
            ("aws://z/vol-\n1", None),
            ("aws://z{/vol-1", None),
        ] {
            assert_eq!(aws_url_path(url).as_deref(), path, "{url}");
        }
    }
}
