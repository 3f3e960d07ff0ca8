//! Loopback networking for tests of servers: a free port to give a binary, and plain HTTP GETs
//! of its metrics and health endpoints.

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, ToSocketAddrs};

/// A free TCP port on 127.0.0.1: bound and released, for a binary under test to bind right
/// after (another process could take it in between, which on a test machine does not happen).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port on 127.0.0.1: {e}"))
}

/// GET `path` over HTTP/1.1 (`Connection: close`): the status code and the body. `None` when
/// nothing answers at `addr` (a server still starting) or the answer is not HTTP.
pub async fn try_http_get(addr: impl ToSocketAddrs, path: &str) -> Option<(u16, String)> {
    let mut conn = TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).await.ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

/// [`try_http_get`] of a server that is up: panics naming `path` when nothing answers.
pub async fn http_get(addr: impl ToSocketAddrs, path: &str) -> (u16, String) {
    try_http_get(addr, path)
        .await
        .unwrap_or_else(|| panic!("GET {path}: no HTTP answer"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn gets_the_status_and_the_body_and_none_where_nothing_listens() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 1024];
            let n = conn.read(&mut buf).await.unwrap();
            let request = String::from_utf8_lossy(&buf[..n]).into_owned();
            conn.write_all(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\n\r\nnot ready",
            )
            .await
            .unwrap();
            request
        });
        assert_eq!(
            http_get(addr, "/readyz").await,
            (503, "not ready".to_string())
        );
        assert!(
            server
                .await
                .unwrap()
                .starts_with("GET /readyz HTTP/1.1\r\n")
        );

        let port = free_port();
        assert_ne!(port, 0);
        assert_eq!(try_http_get(("127.0.0.1", port), "/healthz").await, None);
    }
}
