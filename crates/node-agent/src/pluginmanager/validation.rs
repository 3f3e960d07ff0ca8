//! What the kubelet's CSI registration handler checks in a plugin's `GetInfo` answer before it
//! talks to the driver: a name, and a CSI version it speaks.

use std::fmt;

/// A plugin version as the kubelet parses it (`k8s.io/apimachinery`'s generic versions): an
/// optional `v`, then at least `major.minor` of dot-separated numbers; anything after the
/// numbers is ignored.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Version(Vec<u64>);

impl Version {
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let trimmed = text.trim();
        let numbers = trimmed.strip_prefix('v').unwrap_or(trimmed);
        let end = numbers
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(numbers.len());
        let components: Option<Vec<u64>> = numbers[..end]
            .split('.')
            .map(|c| c.parse::<u64>().ok())
            .collect();
        components.filter(|c| c.len() >= 2).map(Self)
    }

    fn major(&self) -> u64 {
        self.0.first().copied().unwrap_or_default()
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&parts.join("."))
    }
}

/// The kubelet's `ValidatePlugin` for a CSI plugin: a name, and among `versions` a highest
/// version that is 1.x (2.x and later are skipped as unknown; CSI 0.x is refused since
/// Kubernetes 1.17). Returns that version.
pub(crate) fn validate(name: &str, versions: &[String]) -> Result<Version, String> {
    if name.is_empty() {
        return Err(
            "the plugin returned an empty name (GetInfo's name is the CSI driver name)".into(),
        );
    }
    if versions.is_empty() {
        return Err(format!(
            "CSI driver {name:?} returned an empty list of supported versions"
        ));
    }
    let highest = versions
        .iter()
        .filter_map(|v| Version::parse(v))
        .filter(|v| v.major() <= 1)
        .max()
        .ok_or_else(|| {
            format!(
                "none of the versions {versions:?} reported by CSI driver {name:?} is supported \
                 (want 1.x)"
            )
        })?;
    if highest.major() != 1 {
        return Err(format!(
            "the highest version CSI driver {name:?} reports is {highest} (of {versions:?}); it \
             must be 1.x (CSI 0.x is not supported)"
        ));
    }
    Ok(highest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn versions_parse_as_the_kubelet_parses_them() {
        assert_eq!(Version::parse("1.0.0"), Some(Version(vec![1, 0, 0])));
        assert_eq!(Version::parse(" v1.2"), Some(Version(vec![1, 2])));
        assert_eq!(Version::parse("1.5.0-beta"), Some(Version(vec![1, 5, 0])));
        assert_eq!(Version::parse("1"), None, "major.minor at least");
        assert_eq!(Version::parse("one.two"), None);
        assert_eq!(Version::parse(""), None);
        assert!(Version::parse("1.10.0") > Version::parse("1.9.0"));
    }

    #[test]
    fn a_1x_version_is_required() {
        assert_eq!(validate("d", &v(&["1.0.0"])).unwrap().to_string(), "1.0.0");
        assert_eq!(
            validate("d", &v(&["0.3.0", "1.2.0", "2.0.0", "junk"]))
                .unwrap()
                .to_string(),
            "1.2.0"
        );
        let old = validate("d", &v(&["0.3.0"])).unwrap_err();
        assert!(old.contains("0.3.0") && old.contains("1.x"), "{old}");
        let future = validate("d", &v(&["2.0.0"])).unwrap_err();
        assert!(future.contains("2.0.0"), "{future}");
        let none = validate("d", &[]).unwrap_err();
        assert!(none.contains("empty list"), "{none}");
        let nameless = validate("", &v(&["1.0.0"])).unwrap_err();
        assert!(nameless.contains("empty name"), "{nameless}");
    }
}
