//! A per-request audit trail: who (user and User-Agent) called what (verb, resource, object) and the
//! answer's code, so tests and benchmarks can count a component's API calls and check its RBAC
//! needs. The request is described as kube-apiserver's RequestInfo describes it for its audit
//! log: verbs `get list watch create update patch delete deletecollection`, the namespace and
//! name from the path (a list or watch pinned with `fieldSelector=metadata.name=X` names X; a
//! create, the name in its body, as the real log's objectRef), and the subresource. Discovery
//! and other non-resource paths are not recorded.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::Method;

/// A string of an [`AuditRecord`]: shared, because the same few users, verbs, resources and
/// object names repeat in every record. The log keeps one copy of each (interned at
/// [`AuditLog::push`]) and numbers its records' strings; a snapshot's records are reference
/// counts: 66,000 records of a 1,000-pod run took 33.5 MiB as `String`s.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sym(Arc<str>);

impl Sym {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for Sym {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Sym {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Sym {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Sym {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::fmt::Display for Sym {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Sym {
    fn from(s: &str) -> Self {
        Sym(Arc::from(s))
    }
}

impl From<String> for Sym {
    fn from(s: String) -> Self {
        Sym(Arc::from(s))
    }
}

impl PartialEq<str> for Sym {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Sym {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Sym {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<Sym> for &str {
    fn eq(&self, other: &Sym) -> bool {
        **self == *other.0
    }
}

/// One copy of each string the log holds, numbered from 1 (0 is "none").
#[derive(Debug, Default)]
struct Interner {
    strings: Vec<Sym>,
    ids: HashMap<Sym, u32>,
}

impl Interner {
    fn id(&mut self, s: &Sym) -> u32 {
        if let Some(id) = self.ids.get(s.as_str()) {
            return *id;
        }
        self.strings.push(s.clone());
        // Invariant-free: a log of 1,000,000 records cannot hold 2^32 distinct strings, and
        // should it, the last id is reused (a wrong name in a test trail, not a crash).
        let id = u32::try_from(self.strings.len()).unwrap_or(u32::MAX);
        self.ids.insert(s.clone(), id);
        id
    }

    fn id_opt(&mut self, s: &Option<Sym>) -> u32 {
        s.as_ref().map_or(0, |s| self.id(s))
    }

    fn get(&self, id: u32) -> Sym {
        (id as usize)
            .checked_sub(1)
            .and_then(|i| self.strings.get(i))
            .cloned()
            .unwrap_or_default()
    }

    fn get_opt(&self, id: u32) -> Option<Sym> {
        (id != 0).then(|| self.get(id))
    }
}

/// An [`AuditRecord`] as the log keeps it: string ids and nanoseconds, 56 bytes against the
/// record's 184. A 1,000-pod bench keeps ~40,000 records through its burst.
#[derive(Debug, Clone, Copy)]
struct Packed {
    user: u32,
    user_agent: u32,
    verb: u32,
    group: u32,
    version: u32,
    resource: u32,
    subresource: u32,
    namespace: u32,
    name: u32,
    code: u16,
    /// Since the log's epoch.
    received_ns: u64,
    took_ns: u64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One API request, as the real server's audit log would describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    /// The authenticated user's name (each component has its own token).
    pub user: Sym,
    /// The `User-Agent` header ("" when absent).
    pub user_agent: Sym,
    /// get, list, watch, create, update, patch, delete or deletecollection.
    pub verb: Sym,
    /// API group ("" for core).
    pub group: Sym,
    pub version: Sym,
    /// Plural resource name from the path (also for resources this server does not serve).
    pub resource: Sym,
    /// `status`, `binding`, ...
    pub subresource: Option<Sym>,
    pub namespace: Option<Sym>,
    pub name: Option<Sym>,
    /// HTTP status code of the answer (200 for a watch that started).
    pub code: u16,
    /// When the request's body had been read, as kube-apiserver's audit
    /// `requestReceivedTimestamp`: lets a benchmark put a pod's writes on a time line.
    pub received: Instant,
    /// From `received` until the answer was ready (for a watch: until it started), as the
    /// real server's `stageTimestamp` minus `requestReceivedTimestamp`.
    pub took: Duration,
}

/// Records kept; older ones are dropped first.
pub(crate) const AUDIT_LIMIT: usize = 1_000_000;

/// The bounded trail. One short lock per request; readers copy it out.
#[derive(Debug)]
pub(crate) struct AuditLog {
    records: Mutex<Records>,
    limit: usize,
}

#[derive(Debug)]
struct Records {
    kept: VecDeque<Packed>,
    strings: Interner,
    /// What `received` is counted from.
    epoch: Instant,
}

impl Default for Records {
    fn default() -> Self {
        Self {
            kept: VecDeque::new(),
            strings: Interner::default(),
            epoch: Instant::now(),
        }
    }
}

impl Records {
    fn pack(&mut self, r: &AuditRecord) -> Packed {
        let s = &mut self.strings;
        Packed {
            user: s.id(&r.user),
            user_agent: s.id(&r.user_agent),
            verb: s.id(&r.verb),
            group: s.id(&r.group),
            version: s.id(&r.version),
            resource: s.id(&r.resource),
            subresource: s.id_opt(&r.subresource),
            namespace: s.id_opt(&r.namespace),
            name: s.id_opt(&r.name),
            code: r.code,
            // A request received before a clear() counts from the new epoch.
            received_ns: nanos(r.received.saturating_duration_since(self.epoch)),
            took_ns: nanos(r.took),
        }
    }

    fn unpack(&self, p: &Packed) -> AuditRecord {
        let s = &self.strings;
        AuditRecord {
            user: s.get(p.user),
            user_agent: s.get(p.user_agent),
            verb: s.get(p.verb),
            group: s.get(p.group),
            version: s.get(p.version),
            resource: s.get(p.resource),
            subresource: s.get_opt(p.subresource),
            namespace: s.get_opt(p.namespace),
            name: s.get_opt(p.name),
            code: p.code,
            received: self.epoch + Duration::from_nanos(p.received_ns),
            took: Duration::from_nanos(p.took_ns),
        }
    }
}

impl Default for AuditLog {
    fn default() -> Self {
        Self::with_limit(AUDIT_LIMIT)
    }
}

impl AuditLog {
    pub fn with_limit(limit: usize) -> Self {
        Self {
            records: Mutex::new(Records::default()),
            limit: limit.max(1),
        }
    }

    pub fn push(&self, record: AuditRecord) {
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let packed = records.pack(&record);
        if records.kept.len() >= self.limit {
            records.kept.pop_front();
        }
        records.kept.push_back(packed);
    }

    pub fn snapshot(&self) -> Vec<AuditRecord> {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        records.kept.iter().map(|p| records.unpack(p)).collect()
    }

    /// How many records are kept (what `snapshot().len()` would say, without the copy).
    pub fn len(&self) -> usize {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .kept
            .len()
    }

    pub fn clear(&self) {
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        *records = Records::default();
    }
}

/// Describes a request the way RequestInfo does; `None` for non-resource paths (discovery,
/// health, metrics, OpenAPI).
pub(crate) fn describe(
    method: &Method,
    path: &str,
    query: &HashMap<String, String>,
) -> Option<AuditRecord> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, mut parts) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let mut verb = match *method {
        Method::GET | Method::HEAD => "get".to_string(),
        Method::POST => "create".to_string(),
        Method::PUT => "update".to_string(),
        Method::PATCH => "patch".to_string(),
        Method::DELETE => "delete".to_string(),
        ref other => other.as_str().to_lowercase(),
    };
    if let ["watch", rest @ ..] = parts {
        verb = "watch".to_string();
        parts = rest;
    }
    let mut namespace = None;
    if let ["namespaces", ns, rest @ ..] = parts {
        namespace = Some((*ns).to_string());
        // `namespaces/x/status` and `namespaces/x/finalize` are the namespace's own
        // subresources; anything else after the namespace is a resource inside it.
        if !rest.is_empty() && !matches!(rest[0], "status" | "finalize") {
            parts = rest;
        }
    }
    let (resource, mut name, subresource) = match parts {
        [] => return None,
        [r] => (*r, None, None),
        [r, n] => (*r, Some((*n).to_string()), None),
        [r, n, s, ..] => (*r, Some((*n).to_string()), Some((*s).to_string())),
    };
    if name.is_none() && verb == "get" {
        verb = if is_true(query.get("watch")) {
            "watch".to_string()
        } else {
            "list".to_string()
        };
    }
    if name.is_none() && matches!(verb.as_str(), "list" | "watch") {
        name = query
            .get("fieldSelector")
            .and_then(|f| pinned_name(f))
            .map(str::to_string);
    }
    if name.is_none() && verb == "delete" {
        verb = "deletecollection".to_string();
    }
    Some(AuditRecord {
        user: Sym::default(),
        user_agent: Sym::default(),
        verb: verb.into(),
        group: group.into(),
        version: version.into(),
        resource: resource.into(),
        subresource: subresource.map(Sym::from),
        namespace: namespace.map(Sym::from),
        name: name.map(Sym::from),
        code: 0,
        received: Instant::now(),
        took: Duration::ZERO,
    })
}

/// `metadata.name` of a create's body (JSON), without decoding the rest; `None` for a
/// `generateName` create or a body that is not JSON.
pub(crate) fn created_name(body: &[u8]) -> Option<Sym> {
    #[derive(serde::Deserialize)]
    struct Meta {
        name: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Named {
        metadata: Option<Meta>,
    }
    serde_json::from_slice::<Named>(body)
        .ok()?
        .metadata?
        .name
        .filter(|n| !n.is_empty())
        .map(Sym::from)
}

fn is_true(v: Option<&String>) -> bool {
    matches!(v.map(String::as_str), Some("true" | "1"))
}

/// `metadata.name=X` (or `==`) among a field selector's terms.
fn pinned_name(selector: &str) -> Option<&str> {
    selector.split(',').find_map(|term| {
        let term = term.trim();
        if term.contains("!=") {
            return None;
        }
        let value = term
            .strip_prefix("metadata.name==")
            .or_else(|| term.strip_prefix("metadata.name="))?;
        (!value.is_empty() && !value.contains('/') && !value.contains('%')).then_some(value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(method: Method, path: &str, query: &[(&str, &str)]) -> Option<AuditRecord> {
        let q = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        describe(&method, path, &q)
    }

    #[test]
    fn a_create_is_named_from_its_body() {
        let body = br#"{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"pvc-1","labels":{"a":"b"}},"spec":{}}"#;
        assert_eq!(created_name(body).as_deref(), Some("pvc-1"));
        assert_eq!(created_name(br#"{"metadata":{"generateName":"x-"}}"#), None);
        assert_eq!(created_name(b"\x6b\x38\x73\x00 protobuf"), None);
    }

    fn summary(r: &AuditRecord) -> String {
        format!(
            "{} {}/{}/{} sub={:?} ns={:?} name={:?}",
            r.verb, r.group, r.version, r.resource, r.subresource, r.namespace, r.name
        )
    }

    #[test]
    fn request_info_like_the_real_server() {
        let cases = [
            (
                Method::GET,
                "/api/v1/namespaces/kube-system/pods",
                vec![],
                "list /v1/pods sub=None ns=Some(\"kube-system\") name=None",
            ),
            (
                Method::GET,
                "/api/v1/pods",
                vec![("watch", "true")],
                "watch /v1/pods sub=None ns=None name=None",
            ),
            (
                Method::GET,
                "/api/v1/watch/namespaces/d/pods",
                vec![],
                "watch /v1/pods sub=None ns=Some(\"d\") name=None",
            ),
            (
                Method::GET,
                "/apis/coordination.k8s.io/v1/namespaces/d/leases",
                vec![("watch", "1"), ("fieldSelector", "metadata.name=lead")],
                "watch coordination.k8s.io/v1/leases sub=None ns=Some(\"d\") name=Some(\"lead\")",
            ),
            (
                Method::GET,
                "/apis/storage.k8s.io/v1/volumeattachments/va-1",
                vec![],
                "get storage.k8s.io/v1/volumeattachments sub=None ns=None name=Some(\"va-1\")",
            ),
            (
                Method::PATCH,
                "/apis/storage.k8s.io/v1/volumeattachments/va-1/status",
                vec![],
                "patch storage.k8s.io/v1/volumeattachments sub=Some(\"status\") ns=None name=Some(\"va-1\")",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/d/events",
                vec![],
                "create /v1/events sub=None ns=Some(\"d\") name=None",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/d/pods",
                vec![],
                "deletecollection /v1/pods sub=None ns=Some(\"d\") name=None",
            ),
            (
                Method::DELETE,
                "/api/v1/persistentvolumes/pv",
                vec![],
                "delete /v1/persistentvolumes sub=None ns=None name=Some(\"pv\")",
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/d/status",
                vec![],
                "update /v1/namespaces sub=Some(\"status\") ns=Some(\"d\") name=Some(\"d\")",
            ),
            (
                Method::GET,
                "/apis/apps/v1/namespaces/d/replicasets",
                vec![],
                "list apps/v1/replicasets sub=None ns=Some(\"d\") name=None",
            ),
        ];
        for (m, path, q, want) in cases {
            let r = d(m, path, &q).unwrap_or_else(|| panic!("{path}"));
            assert_eq!(summary(&r), want, "{path}");
        }
        for path in [
            "/api",
            "/api/v1",
            "/apis/apps/v1",
            "/version",
            "/healthz",
            "/openapi/v2",
        ] {
            assert!(d(Method::GET, path, &[]).is_none(), "{path}");
        }
    }

    #[test]
    fn the_log_is_bounded_and_clearable() {
        let log = AuditLog::with_limit(2);
        for name in ["a", "b", "c"] {
            let mut r = d(Method::GET, "/api/v1/pods", &[]).unwrap();
            r.user_agent = name.into();
            log.push(r);
        }
        let kept: Vec<String> = log
            .snapshot()
            .into_iter()
            .map(|r| r.user_agent.to_string())
            .collect();
        assert_eq!(kept, vec!["b", "c"], "the oldest goes first");
        log.clear();
        assert!(log.snapshot().is_empty());
    }

    #[test]
    fn the_log_keeps_one_copy_of_each_string() {
        let log = AuditLog::default();
        for _ in 0..2 {
            let mut r = d(Method::PATCH, "/api/v1/namespaces/ns/pods/p-1/status", &[]).unwrap();
            r.user = String::from("system:node:n1").into();
            log.push(r);
        }
        let [a, b] = <[AuditRecord; 2]>::try_from(log.snapshot()).unwrap();
        assert!(Arc::ptr_eq(&a.user.0, &b.user.0), "one copy of the user");
        assert!(Arc::ptr_eq(&a.verb.0, &b.verb.0));
        let (an, bn) = (a.name.unwrap(), b.name.unwrap());
        assert!(Arc::ptr_eq(&an.0, &bn.0), "one copy of the name");
        assert_eq!(an, "p-1");
        assert_eq!(a.subresource.as_deref(), Some("status"));
    }

    #[test]
    fn a_record_comes_back_as_it_went_in() {
        let log = AuditLog::default();
        let mut r = d(
            Method::PATCH,
            "/apis/storage.k8s.io/v1/volumeattachments/va-1/status",
            &[],
        )
        .unwrap();
        r.user = "system:serviceaccount:kube-system:csi-attacher".into();
        r.user_agent = "csi-attacher/v1".into();
        r.code = 409;
        r.took = Duration::from_micros(1234);
        let mut without_optionals = d(Method::GET, "/api/v1/pods", &[]).unwrap();
        without_optionals.code = 200;
        log.push(r.clone());
        log.push(without_optionals.clone());
        assert_eq!(log.len(), 2);
        let back = log.snapshot();
        // Instants come back through nanoseconds since the epoch: equal to the nanosecond.
        assert_eq!(back, vec![r, without_optionals]);
        assert!(
            back[1].namespace.is_none() && back[1].name.is_none() && back[1].subresource.is_none()
        );
        assert!(
            std::mem::size_of::<Packed>() <= 56,
            "{}",
            std::mem::size_of::<Packed>()
        );
    }
}
