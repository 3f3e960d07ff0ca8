//! The pod's service account tokens a CSIDriver asks for (`spec.tokenRequests`), as the
//! kubelet passes them on NodePublish: one TokenRequest per entry for the pod's
//! ServiceAccount, bound to the pod, in volume_context key
//! `csi.storage.k8s.io/serviceAccount.tokens` as
//! `{"<audience>": {"token": "...", "expirationTimestamp": "<RFC 3339>"}}` (the audience as the
//! CSIDriver spells it: `""` for the API server's own audiences).
//!
//! Tokens are cached as the kubelet's token manager caches them: per pod, account, audience and
//! requested lifetime, asked for again once 80 % of their lifetime (or 24 hours) has passed, so
//! a driver with `requiresRepublish` gets the same token on each republish until then, and a
//! fresh one before the old one expires.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::storage::v1::TokenRequest as CsiTokenRequest;
use kube::api::PostParams;
use kube::{Api, Client};
use serde::Serialize;

use super::PodInfo;

/// The volume_context key the tokens go in.
pub const TOKENS_CONTEXT_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// What a publish that could not get its tokens fails with (the kubelet's words), before the
/// cause.
pub const FAILED: &str =
    "kubernetes.io/csi: mounter.SetUpAt failed to get service account token attributes";

/// A token is asked for again after this share of its lifetime...
const REFRESH_AT_PERCENT: i64 = 80;
/// ...or after this long, whichever comes first.
const REFRESH_AFTER: SignedDuration = SignedDuration::from_hours(24);

/// One token as the driver gets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
struct TokenStatus {
    token: String,
    expiration_timestamp: String,
}

#[derive(Debug, Clone)]
struct Cached {
    status: TokenStatus,
    issued: Timestamp,
    expires: Timestamp,
}

impl Cached {
    fn fresh(&self, now: Timestamp) -> bool {
        let lifetime = self.expires.duration_since(self.issued);
        let refresh = self
            .issued
            .checked_add(lifetime * REFRESH_AT_PERCENT as i32 / 100)
            .ok()
            .into_iter()
            .chain(self.issued.checked_add(REFRESH_AFTER).ok())
            .min()
            .unwrap_or(self.issued);
        now < refresh && now < self.expires
    }
}

/// (namespace, account, pod uid, audience, expirationSeconds).
type CacheKey = (String, String, String, String, Option<i64>);

/// The tokens handed out so far (shared by every operation).
#[derive(Debug, Clone, Default)]
pub struct TokenCache {
    entries: Arc<Mutex<HashMap<CacheKey, Cached>>>,
}

impl TokenCache {
    fn get(&self, key: &CacheKey, now: Timestamp) -> Option<TokenStatus> {
        let map = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(key)
            .filter(|c| c.fresh(now))
            .map(|c| c.status.clone())
    }

    fn put(&self, key: CacheKey, value: Cached, now: Timestamp) {
        let mut map = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, c| c.expires > now);
        map.insert(key, value);
    }
}

/// The value of [`TOKENS_CONTEXT_KEY`] for `pod`: one token per request, asked for through
/// the TokenRequest API (or taken from `cache` while still fresh). The error says which
/// request failed and why.
pub(super) async fn tokens_for(
    client: &Client,
    cache: &TokenCache,
    pod: &PodInfo,
    requests: &[CsiTokenRequest],
) -> Result<String, String> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &pod.namespace);
    let mut out: BTreeMap<String, TokenStatus> = BTreeMap::new();
    for r in requests {
        let now = Timestamp::now();
        let key = (
            pod.namespace.clone(),
            pod.service_account.clone(),
            pod.uid.clone(),
            r.audience.clone(),
            r.expiration_seconds,
        );
        if let Some(status) = cache.get(&key, now) {
            out.insert(r.audience.clone(), status);
            continue;
        }
        let request = TokenRequest {
            spec: TokenRequestSpec {
                // No audience: the API server's own.
                audiences: if r.audience.is_empty() {
                    Vec::new()
                } else {
                    vec![r.audience.clone()]
                },
                expiration_seconds: r.expiration_seconds,
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.name.clone()),
                    uid: Some(pod.uid.clone()),
                }),
            },
            ..Default::default()
        };
        let answer = api
            .create_token_request(&pod.service_account, &PostParams::default(), &request)
            .await
            .map_err(|e| {
                let why = match &e {
                    kube::Error::Api(s) => s.message.clone(),
                    other => other.to_string(),
                };
                format!(
                    "failed to fetch token for service account {}/{} (audience {:?}): {why}",
                    pod.namespace, pod.service_account, r.audience
                )
            })?;
        let Some(status) = answer.status else {
            return Err(format!(
                "failed to fetch token for service account {}/{}: the TokenRequest came back without a status",
                pod.namespace, pod.service_account
            ));
        };
        let expires = status.expiration_timestamp.0;
        let token = TokenStatus {
            token: status.token,
            expiration_timestamp: expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        };
        cache.put(
            key,
            Cached {
                status: token.clone(),
                issued: now,
                expires,
            },
            now,
        );
        out.insert(r.audience.clone(), token);
    }
    serde_json::to_string(&out).map_err(|e| format!("encoding the service account tokens: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cached(issued: Timestamp, lifetime_s: i64) -> Cached {
        Cached {
            status: TokenStatus {
                token: "t".into(),
                expiration_timestamp: String::new(),
            },
            issued,
            expires: issued + SignedDuration::from_secs(lifetime_s),
        }
    }

    #[test]
    fn tokens_are_refreshed_at_80_percent_or_after_a_day() {
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let at = |s: i64| t0 + SignedDuration::from_secs(s);
        let hour = cached(t0, 3600);
        assert!(hour.fresh(at(0)));
        assert!(hour.fresh(at(2879)));
        assert!(!hour.fresh(at(2880)), "80 % of an hour");
        let week = cached(t0, 7 * 24 * 3600);
        assert!(week.fresh(at(24 * 3600 - 1)));
        assert!(!week.fresh(at(24 * 3600)), "a day at most");
    }

    #[test]
    fn the_context_value_is_keyed_by_audience() {
        let mut out = BTreeMap::new();
        out.insert(
            String::new(),
            TokenStatus {
                token: "a".into(),
                expiration_timestamp: "2026-01-01T00:00:00Z".into(),
            },
        );
        assert_eq!(
            serde_json::to_string(&out).unwrap(),
            r#"{"":{"token":"a","expirationTimestamp":"2026-01-01T00:00:00Z"}}"#
        );
    }
}
