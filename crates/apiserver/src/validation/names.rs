//! Kubernetes' name and label syntax rules, with the real validators' messages.

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

fn is_label_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// RFC 1123 label (namespaces): problems, empty when valid.
pub(crate) fn dns1123_label(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 63 {
        out.push("must be no more than 63 characters".to_string());
    }
    if !is_label_part(s) {
        out.push(DNS1123_LABEL_MSG.to_string());
    }
    out
}

/// An IANA service name (a container port's name, a probe's named port): problems, empty
/// when valid. kube-apiserver refuses a 16-character port name that apiserver-lite once took.
pub(crate) fn port_name(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 15 {
        out.push("must be no more than 15 characters".to_string());
    }
    if !s
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        || s.is_empty()
    {
        out.push(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string(),
        );
    }
    if !s.bytes().any(|c| c.is_ascii_lowercase()) {
        out.push("must contain at least one letter (a-z)".to_string());
    }
    if s.contains("--") {
        out.push("must not contain consecutive hyphens".to_string());
    }
    if s.starts_with('-') || s.ends_with('-') {
        out.push("must not begin or end with a hyphen".to_string());
    }
    out
}

/// RFC 1123 subdomain (most object names): problems, empty when valid.
pub(crate) fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 253 {
        out.push("must be no more than 253 characters".to_string());
    }
    if !s.split('.').all(is_label_part) {
        out.push(DNS1123_SUBDOMAIN_MSG.to_string());
    }
    out
}

fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// A qualified name (`prefix/name`): label keys, finalizers. Problems, empty when valid.
pub(crate) fn qualified_name(s: &str) -> Vec<String> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let mut out = Vec::new();
    if let Some(p) = prefix {
        if p.is_empty() {
            out.push("prefix part must be non-empty".to_string());
        } else {
            out.extend(
                dns1123_subdomain(p)
                    .into_iter()
                    .map(|m| format!("prefix part {m}")),
            );
        }
    }
    if name.is_empty() {
        out.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        out.push("name part must be no more than 63 characters".to_string());
    } else if !is_name_part(name) {
        out.push(QUALIFIED_NAME_MSG.to_string());
    }
    out
}

pub(crate) fn label_value(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 63 {
        out.push("must be no more than 63 characters".to_string());
    }
    let b = s.as_bytes();
    let well_formed = b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric);
    if !s.is_empty() && !well_formed {
        out.push(LABEL_VALUE_MSG.to_string());
    }
    out
}

/// A name usable as one URL path segment (RBAC objects, events): problems, empty when valid.
pub(crate) fn path_segment_name(s: &str) -> Vec<String> {
    if s == "." || s == ".." {
        return vec![format!("may not be '{s}'")];
    }
    ["/", "%"]
        .iter()
        .filter(|bad| s.contains(*bad))
        .map(|bad| format!("may not contain '{bad}'"))
        .collect()
}

/// A ConfigMap or Secret data key.
pub(crate) fn config_key(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 253 {
        out.push("must be no more than 253 characters".to_string());
    }
    if s.is_empty()
        || !s
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c))
    {
        out.push("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')".to_string());
    }
    if s == "." || s == ".." || s.starts_with("..") {
        out.push("must not be '.' or '..' or start with '..'".to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(dns1123_label("default").is_empty());
        assert!(!dns1123_label("a.b").is_empty());
        assert!(!dns1123_label("-a").is_empty());
        assert!(dns1123_subdomain("pvc-1.example.com").is_empty());
        assert!(!dns1123_subdomain("Upper").is_empty());
        assert!(!dns1123_subdomain("").is_empty());
        assert!(!dns1123_subdomain("a..b").is_empty());
        assert!(qualified_name("kubernetes.io/pv-protection").is_empty());
        assert!(qualified_name("external-attacher/ebs-csi-aws-com").is_empty());
        assert!(!qualified_name("a/b/c").is_empty());
        assert!(!qualified_name("/x").is_empty());
        assert!(label_value("").is_empty());
        assert!(label_value("v1.2_x").is_empty());
        assert!(!label_value("-x").is_empty());
        assert!(!label_value(&"a".repeat(64)).is_empty());
        // Multi-byte characters are rejected, never sliced through.
        assert_eq!(label_value(&"é".repeat(40)).len(), 2);
        assert!(path_segment_name("system:csi-external-attacher").is_empty());
        assert_eq!(path_segment_name(".."), vec!["may not be '..'"]);
        assert_eq!(path_segment_name("a/b%c").len(), 2);
        assert!(config_key("ca.crt").is_empty());
        assert!(!config_key("a b").is_empty());
        assert!(!config_key("..x").is_empty());
    }
}
