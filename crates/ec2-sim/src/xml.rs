//! A minimal XML writer for EC2 query-protocol responses, and the EC2 error document.

use std::fmt::Write as _;

pub(crate) const EC2_NS: &str = "http://ec2.amazonaws.com/doc/2016-11-15/";

/// Builds one response document. Elements are written in call order; `end` must match.
pub(crate) struct Xml {
    buf: String,
    root: String,
}

impl Xml {
    /// Starts `<ActionResponse xmlns=...><requestId>..</requestId>`.
    pub(crate) fn response(action: &str, request_id: &str) -> Xml {
        let root = format!("{action}Response");
        let mut buf = String::with_capacity(1024);
        let _ = write!(
            buf,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<{root} xmlns=\"{EC2_NS}\"><requestId>{}</requestId>",
            escape(request_id)
        );
        Xml { buf, root }
    }

    pub(crate) fn start(&mut self, tag: &str) -> &mut Self {
        self.buf.push('<');
        self.buf.push_str(tag);
        self.buf.push('>');
        self
    }

    pub(crate) fn end(&mut self, tag: &str) -> &mut Self {
        self.buf.push_str("</");
        self.buf.push_str(tag);
        self.buf.push('>');
        self
    }

    /// `<tag>value</tag>` with the value escaped.
    pub(crate) fn leaf(&mut self, tag: &str, value: impl std::fmt::Display) -> &mut Self {
        self.start(tag);
        let text = value.to_string();
        self.buf.push_str(&escape(&text));
        self.end(tag)
    }

    /// A leaf only when the value is present.
    pub(crate) fn opt_leaf<T: std::fmt::Display>(
        &mut self,
        tag: &str,
        value: Option<T>,
    ) -> &mut Self {
        if let Some(v) = value {
            self.leaf(tag, v);
        }
        self
    }

    pub(crate) fn finish(mut self) -> String {
        let root = std::mem::take(&mut self.root);
        self.end(&root);
        self.buf
    }
}

pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// An EC2 API error: code, message and HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub(crate) status: u16,
    pub(crate) code: String,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(code: &str, message: impl Into<String>) -> ApiError {
        let status = match code {
            "RequestLimitExceeded" | "ServiceUnavailable" | "Unavailable" => 503,
            "DryRunOperation" => 412,
            "AuthFailure" => 401,
            "SignatureDoesNotMatch" => 403,
            "InternalError" => 500,
            _ => 400,
        };
        ApiError {
            status,
            code: code.to_string(),
            message: message.into(),
        }
    }

    pub(crate) fn invalid_value(field: &str, value: &str, why: &str) -> ApiError {
        ApiError::new(
            "InvalidParameterValue",
            format!("Value ({value}) for parameter {field} is invalid. {why}"),
        )
    }

    pub(crate) fn missing(field: &str) -> ApiError {
        ApiError::new(
            "MissingParameter",
            format!("The request must contain the parameter {field}"),
        )
    }

    pub(crate) fn combination(message: impl Into<String>) -> ApiError {
        ApiError::new("InvalidParameterCombination", message)
    }

    pub(crate) fn dry_run() -> ApiError {
        ApiError::new(
            "DryRunOperation",
            "Request would have succeeded, but DryRun flag is set.",
        )
    }

    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new("InternalError", message)
    }

    /// The EC2 error document.
    pub(crate) fn to_xml(&self, request_id: &str) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code><Message>{}</Message></Error></Errors><RequestID>{}</RequestID></Response>",
            escape(&self.code),
            escape(&self.message),
            escape(request_id)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_escapes_and_nests() {
        let mut x = Xml::response("CreateTags", "r-1");
        x.start("tagSet").leaf("key", "a<b&c").end("tagSet");
        let s = x.finish();
        assert!(s.contains("<CreateTagsResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>r-1</requestId><tagSet><key>a&lt;b&amp;c</key></tagSet></CreateTagsResponse>"), "{s}");
    }

    #[test]
    fn error_statuses() {
        assert_eq!(ApiError::new("RequestLimitExceeded", "x").status, 503);
        assert_eq!(ApiError::dry_run().status, 412);
        assert_eq!(ApiError::new("InvalidVolume.NotFound", "x").status, 400);
        let doc = ApiError::new("VolumeInUse", "busy").to_xml("abc");
        assert!(doc.contains("<Response><Errors><Error><Code>VolumeInUse</Code><Message>busy</Message></Error></Errors><RequestID>abc</RequestID></Response>"));
    }
}
