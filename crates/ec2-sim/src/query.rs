//! EC2 query-protocol request parameters: flat `Name=Value` pairs with numbered lists
//! (`VolumeId.1`, `Filter.1.Name`, `Filter.1.Value.1`, `TagSpecification.1.Tag.1.Key`).

use std::collections::BTreeMap;

use crate::xml::ApiError;

/// The parameters of one request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Params {
    map: BTreeMap<String, String>,
}

/// One `Filter.N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Filter {
    pub(crate) name: String,
    pub(crate) values: Vec<String>,
}

impl Params {
    pub(crate) fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Params {
        Params {
            map: pairs.into_iter().collect(),
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.map.get(key).map(String::as_str)
    }

    /// Every `(name, value)`, in name order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub(crate) fn require(&self, key: &str) -> Result<&str, ApiError> {
        match self.get(key) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(ApiError::missing(key)),
        }
    }

    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) if v.eq_ignore_ascii_case("true") => Ok(Some(true)),
            Some(v) if v.eq_ignore_ascii_case("false") => Ok(Some(false)),
            Some(v) => Err(ApiError::invalid_value(key, v, "Expected true or false.")),
        }
    }

    pub(crate) fn flag(&self, key: &str) -> Result<bool, ApiError> {
        Ok(self.bool(key)?.unwrap_or(false))
    }

    pub(crate) fn int(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .parse::<i64>()
                .map(Some)
                .map_err(|_| ApiError::invalid_value(key, v, "Expected an integer.")),
        }
    }

    /// `Prefix.1`, `Prefix.2`, ... in index order.
    pub(crate) fn list(&self, prefix: &str) -> Vec<String> {
        let mut items: Vec<(u32, String)> = Vec::new();
        let dotted = format!("{prefix}.");
        for (k, v) in self.map.range(dotted.clone()..) {
            let Some(rest) = k.strip_prefix(&dotted) else {
                break;
            };
            if let Ok(n) = rest.parse::<u32>() {
                items.push((n, v.clone()));
            }
        }
        items.sort_by_key(|(n, _)| *n);
        items.into_iter().map(|(_, v)| v).collect()
    }

    /// The indexes `N` for which some `Prefix.N.<anything>` exists, in order.
    pub(crate) fn indexes(&self, prefix: &str) -> Vec<u32> {
        let dotted = format!("{prefix}.");
        let mut out: Vec<u32> = Vec::new();
        for k in self.map.range(dotted.clone()..).map(|(k, _)| k) {
            let Some(rest) = k.strip_prefix(&dotted) else {
                break;
            };
            if let Some((n, _)) = rest.split_once('.') {
                if let Ok(n) = n.parse::<u32>() {
                    if !out.contains(&n) {
                        out.push(n);
                    }
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// Whether any parameter name starts with `prefix`.
    pub(crate) fn has_prefix(&self, prefix: &str) -> bool {
        self.map
            .range(prefix.to_string()..)
            .next()
            .is_some_and(|(k, _)| k.starts_with(prefix))
    }

    /// `Filter.N.Name` / `Filter.N.Value.M`.
    pub(crate) fn filters(&self) -> Result<Vec<Filter>, ApiError> {
        let mut out = Vec::new();
        for n in self.indexes("Filter") {
            let name = self
                .get(&format!("Filter.{n}.Name"))
                .ok_or_else(|| ApiError::missing(&format!("Filter.{n}.Name")))?
                .to_string();
            let values = self.list(&format!("Filter.{n}.Value"));
            out.push(Filter { name, values });
        }
        Ok(out)
    }

    /// `Prefix.N.Key` / `Prefix.N.Value` pairs (value defaults to empty).
    pub(crate) fn tags(&self, prefix: &str) -> Result<Vec<(String, Option<String>)>, ApiError> {
        let mut out = Vec::new();
        for n in self.indexes(prefix) {
            let key = self
                .get(&format!("{prefix}.{n}.Key"))
                .ok_or_else(|| ApiError::missing(&format!("{prefix}.{n}.Key")))?
                .to_string();
            let value = self.get(&format!("{prefix}.{n}.Value")).map(str::to_string);
            out.push((key, value));
        }
        Ok(out)
    }

    /// Tags of every `TagSpecification.N` whose `ResourceType` is `resource_type`; another
    /// resource type is an error as in AWS.
    pub(crate) fn tag_specifications(
        &self,
        resource_type: &str,
    ) -> Result<Vec<(String, String)>, ApiError> {
        self.tag_specifications_for(resource_type, &[])
    }

    /// Like [`Params::tag_specifications`], also accepting (and ignoring) the resource types in
    /// `ignored` (RunInstances may tag volumes and interfaces it creates).
    pub(crate) fn tag_specifications_for(
        &self,
        resource_type: &str,
        ignored: &[&str],
    ) -> Result<Vec<(String, String)>, ApiError> {
        let mut out = Vec::new();
        for n in self.indexes("TagSpecification") {
            let field = format!("TagSpecification.{n}.ResourceType");
            let rt = self.require(&field)?;
            if ignored.contains(&rt) {
                continue;
            }
            if rt != resource_type {
                return Err(ApiError::invalid_value(
                    "ResourceType",
                    rt,
                    &format!(
                        "This operation only accepts tag specifications for '{resource_type}'."
                    ),
                ));
            }
            for (k, v) in self.tags(&format!("TagSpecification.{n}.Tag"))? {
                check_tag(&k, v.as_deref().unwrap_or(""))?;
                out.push((k, v.unwrap_or_default()));
            }
        }
        Ok(out)
    }

    /// A stable digest of every parameter but the ones listed, for ClientToken comparison.
    pub(crate) fn fingerprint(&self, except: &[&str]) -> String {
        let mut s = String::new();
        for (k, v) in &self.map {
            if except.contains(&k.as_str()) {
                continue;
            }
            s.push_str(k);
            s.push('=');
            s.push_str(v);
            s.push('\n');
        }
        s
    }
}

/// AWS tag limits: key 1..=128 characters, not `aws:`-prefixed; value up to 256.
pub(crate) fn check_tag(key: &str, value: &str) -> Result<(), ApiError> {
    if key.is_empty() || key.chars().count() > 128 {
        return Err(ApiError::invalid_value(
            "Tag.Key",
            key,
            "Tag keys must be 1 to 128 characters long.",
        ));
    }
    if key.to_ascii_lowercase().starts_with("aws:") {
        return Err(ApiError::invalid_value(
            "Tag.Key",
            key,
            "Tag keys starting with 'aws:' are reserved for internal use.",
        ));
    }
    if value.chars().count() > 256 {
        return Err(ApiError::invalid_value(
            "Tag.Value",
            value,
            "Tag values may be at most 256 characters long.",
        ));
    }
    Ok(())
}

/// AWS filter values are globs: `*` any run, `?` one character.
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// Matches one filter: any of its values matches any of the candidate strings.
pub(crate) fn filter_matches<'a>(
    filter: &Filter,
    candidates: impl IntoIterator<Item = &'a str>,
) -> bool {
    let candidates: Vec<&str> = candidates.into_iter().collect();
    filter
        .values
        .iter()
        .any(|pat| candidates.iter().any(|c| glob_match(pat, c)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, &str)]) -> Params {
        Params::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn lists_are_ordered_numerically() {
        let q = p(&[
            ("VolumeId.10", "c"),
            ("VolumeId.2", "b"),
            ("VolumeId.1", "a"),
        ]);
        assert_eq!(q.list("VolumeId"), vec!["a", "b", "c"]);
        assert!(q.list("InstanceId").is_empty());
    }

    #[test]
    fn filters_and_tag_specs() {
        let q = p(&[
            ("Filter.1.Name", "tag:env"),
            ("Filter.1.Value.1", "prod"),
            ("Filter.1.Value.2", "dev"),
            ("Filter.2.Name", "status"),
            ("Filter.2.Value.1", "available"),
            ("TagSpecification.1.ResourceType", "volume"),
            ("TagSpecification.1.Tag.1.Key", "a"),
            ("TagSpecification.1.Tag.1.Value", "1"),
            ("TagSpecification.1.Tag.2.Key", "b"),
        ]);
        let f = q.filters().unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].values, vec!["prod", "dev"]);
        let tags = q.tag_specifications("volume").unwrap();
        assert_eq!(
            tags,
            vec![("a".into(), "1".into()), ("b".into(), String::new())]
        );
        let err = q.tag_specifications("snapshot").unwrap_err();
        assert_eq!(err.code, "InvalidParameterValue");
    }

    #[test]
    fn reserved_tag_key_rejected() {
        assert!(check_tag("aws:foo", "x").is_err());
        assert!(check_tag("", "x").is_err());
        assert!(check_tag("k", "v").is_ok());
    }

    #[test]
    fn globs() {
        assert!(glob_match("vol-*", "vol-123"));
        assert!(glob_match("us-east-1?", "us-east-1a"));
        assert!(!glob_match("us-east-1?", "us-east-1ab"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "aXXbYc"));
        assert!(!glob_match("a*b*c", "aXXbY"));
    }

    #[test]
    fn bad_bool_and_int_name_the_field() {
        let q = p(&[("DryRun", "yes"), ("Size", "ten")]);
        assert!(q.bool("DryRun").unwrap_err().message.contains("DryRun"));
        assert!(q.int("Size").unwrap_err().message.contains("Size"));
    }
}
