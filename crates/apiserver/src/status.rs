//! Errors in the real server's `Status` shape: the same `reason`, `code`, `message` and
//! `details`, so clients' `IsNotFound`/`IsConflict`/... checks behave as against Kubernetes.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

use crate::resources::ResourceDef;

/// One invalid field, as Kubernetes' `field.Error`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FieldError {
    pub field: String,
    pub kind: FieldErrorKind,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum FieldErrorKind {
    Required,
    Invalid(Value),
    Forbidden,
    NotSupported(Value, &'static [&'static str]),
    TooLong(Value, usize),
    NotFound(Value),
    Duplicate(Value),
}

impl FieldError {
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Required,
            detail: detail.into(),
        }
    }
    pub fn invalid(field: impl Into<String>, value: Value, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Invalid(value),
            detail: detail.into(),
        }
    }
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Forbidden,
            detail: detail.into(),
        }
    }
    pub fn not_supported(
        field: impl Into<String>,
        value: Value,
        supported: &'static [&'static str],
    ) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::NotSupported(value, supported),
            detail: String::new(),
        }
    }
    /// A reference to something the object does not define (a volume mount's volume).
    pub fn not_found(field: impl Into<String>, value: Value) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::NotFound(value),
            detail: String::new(),
        }
    }
    pub fn duplicate(field: impl Into<String>, value: Value) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Duplicate(value),
            detail: String::new(),
        }
    }
    pub fn too_long(field: impl Into<String>, value: Value, max: usize) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::TooLong(value, max),
            detail: String::new(),
        }
    }

    fn reason(&self) -> &'static str {
        match self.kind {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid(_) => "FieldValueInvalid",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::NotSupported(..) => "FieldValueNotSupported",
            FieldErrorKind::TooLong(..) => "FieldValueTooLong",
            FieldErrorKind::NotFound(_) => "FieldValueNotFound",
            FieldErrorKind::Duplicate(_) => "FieldValueDuplicate",
        }
    }

    /// The message without the field path, as `field.Error.ErrorBody()`.
    pub fn body(&self) -> String {
        let mut s = match &self.kind {
            FieldErrorKind::Required => "Required value".to_string(),
            FieldErrorKind::Invalid(v) => format!("Invalid value: {v}"),
            FieldErrorKind::Forbidden => "Forbidden".to_string(),
            FieldErrorKind::NotSupported(v, supported) => {
                let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
                format!(
                    "Unsupported value: {v}: supported values: {}",
                    list.join(", ")
                )
            }
            FieldErrorKind::TooLong(_, max) => {
                format!("Too long: may not be more than {max} bytes")
            }
            FieldErrorKind::NotFound(v) => format!("Not found: {v}"),
            FieldErrorKind::Duplicate(v) => format!("Duplicate value: {v}"),
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// An error answered to the client as a `Status` object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    fn object_details(def: &ResourceDef, name: &str) -> Value {
        json!({ "name": name, "group": def.group, "kind": def.plural })
    }

    pub fn not_found(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", def.qualified_resource()),
        )
        .with_details(Self::object_details(def, name))
    }

    /// A path under a served API group/version that names no served resource: go-restful's
    /// 404 in kube-apiserver, a `Status` with empty `details`.
    pub fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    /// A path outside the API (`/nothing`, `/swagger.json`): kube-apiserver's not-found
    /// handler at the end of its delegation chain, the same `Status` without `details`.
    pub fn unknown_path() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub fn namespace_not_found(ns: &str) -> Self {
        Self::new(404, "NotFound", format!("namespaces \"{ns}\" not found"))
            .with_details(json!({ "name": ns, "kind": "namespaces" }))
    }

    pub fn already_exists(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", def.qualified_resource()),
        )
        .with_details(Self::object_details(def, name))
    }

    pub fn conflict(def: &ResourceDef, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                def.qualified_resource()
            ),
        )
        .with_details(Self::object_details(def, name))
    }

    /// A 409 `Conflict` on something named by group and resource only (kube-apiserver's
    /// `NewConflict` with a hand-made GroupResource).
    pub fn conflict_on(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let qualified = if group.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}.{group}")
        };
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {qualified} \"{name}\": {why}"),
        )
        .with_details(json!({ "name": name, "group": group, "kind": resource }))
    }

    pub fn stale(def: &ResourceDef, name: &str) -> Self {
        Self::conflict(
            def,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn invalid(def: &ResourceDef, name: &str, errors: &[FieldError]) -> Self {
        Self::invalid_named(&def.qualified_kind(), def.group, def.kind, name, errors)
    }

    /// [`Self::invalid`] for a kind that is not a stored resource (a TokenRequest).
    pub fn invalid_kind(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> Self {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        Self::invalid_named(&qualified, group, kind, name, errors)
    }

    fn invalid_named(
        qualified: &str,
        group: &str,
        kind: &str,
        name: &str,
        errors: &[FieldError],
    ) -> Self {
        let joined = if errors.len() == 1 {
            errors[0].to_string()
        } else {
            let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
            format!("[{}]", all.join(", "))
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({ "reason": e.reason(), "message": e.body(), "field": e.field }))
            .collect();
        Self::new(
            422,
            "Invalid",
            format!("{qualified} \"{name}\" is invalid: {joined}"),
        )
        .with_details(json!({
            "name": name,
            "group": group,
            "kind": kind,
            "causes": causes,
        }))
    }

    /// 422 for invalid query options (`ListOptions.meta.k8s.io "" is invalid: ...`).
    pub fn invalid_options(errors: &[FieldError]) -> Self {
        let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let joined = if all.len() == 1 {
            all[0].clone()
        } else {
            format!("[{}]", all.join(", "))
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({ "reason": e.reason(), "message": e.body(), "field": e.field }))
            .collect();
        Self::new(
            422,
            "Invalid",
            format!("ListOptions.meta.k8s.io \"\" is invalid: {joined}"),
        )
        .with_details(json!({"group": "meta.k8s.io", "kind": "ListOptions", "causes": causes}))
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// What kube-apiserver answers a request no authenticator accepted (anonymous auth off).
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
        .with_details(json!({}))
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub fn forbidden(def: &ResourceDef, name: &str, why: &str) -> Self {
        Self::new(
            403,
            "Forbidden",
            format!(
                "{} \"{name}\" is forbidden: {why}",
                def.qualified_resource()
            ),
        )
        .with_details(Self::object_details(def, name))
    }

    pub fn too_large_rv(requested: u64, current: u64) -> Self {
        Self::new(
            504,
            "Timeout",
            format!("Timeout: Too large resource version: {requested}, current: {current}"),
        )
        .with_details(json!({
            "causes": [{ "reason": "ResourceVersionTooLarge", "message": "Too large resource version" }],
            "retryAfterSeconds": 1,
        }))
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// A 500 whose Status names no reason: what kube-apiserver answers when its storage
    /// layer refuses a request outright (a create that sets `resourceVersion`).
    pub fn storage(message: impl Into<String>) -> Self {
        Self::new(500, "", message)
    }

    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if self.reason.is_empty() {
            if let Some(m) = v.as_object_mut() {
                m.remove("reason");
            }
        }
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        crate::http_util::json_response(code, &self.to_status())
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;

    #[test]
    fn invalid_status_has_causes_and_kind() {
        let def =
            resources::get(resources::find("storage.k8s.io", "v1", "volumeattachments").unwrap());
        let e = ApiError::invalid(
            def,
            "va",
            &[
                FieldError::required("spec.attacher", ""),
                FieldError::invalid("metadata.name", json!("A"), "bad"),
            ],
        );
        let s = e.to_status();
        assert_eq!(s["code"], 422);
        assert_eq!(s["reason"], "Invalid");
        assert_eq!(s["details"]["kind"], "VolumeAttachment");
        assert_eq!(s["details"]["causes"][0]["field"], "spec.attacher");
        assert_eq!(
            s["details"]["causes"][1]["message"],
            "Invalid value: \"A\": bad"
        );
        assert_eq!(
            s["message"],
            "VolumeAttachment.storage.k8s.io \"va\" is invalid: [spec.attacher: Required value, metadata.name: Invalid value: \"A\": bad]"
        );
    }

    #[test]
    fn not_found_names_the_resource() {
        let def = resources::get(resources::find("", "v1", "pods").unwrap());
        let s = ApiError::not_found(def, "p").to_status();
        assert_eq!(s["message"], "pods \"p\" not found");
        assert_eq!(s["details"]["kind"], "pods");
        assert_eq!(s["code"], 404);
    }
}
