//! The ADC's own account of its work: one scrape of its `/metrics` at the end of a scenario,
//! keeping the attach/detach series (`attachdetach_controller_*`, the
//! `storage_operation_duration_seconds` counts). Best effort: a report without them is still a
//! report, so failures come back as text for the log.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one scrape may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// A free loopback port for the ADC's `--http-endpoint`. The listener is closed before the ADC
/// binds it; another process taking the port in between is possible but unlikely, and shows as
/// a failed scrape, not a failed run.
pub(crate) fn free_port() -> Result<SocketAddr, std::io::Error> {
    std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()
}

/// Series worth keeping in the report.
fn kept(name: &str) -> bool {
    name.starts_with("attachdetach_controller_")
        || name.starts_with("storage_operation_duration_seconds_count")
}

/// The kept samples of a Prometheus text exposition, keyed by `name{labels}`.
pub(crate) fn parse(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.trim().rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            kept(key).then(|| (key.to_owned(), value))
        })
        .collect()
}

/// GETs `http://ADDR/metrics` (HTTP/1.0: the answer ends with the connection).
pub(crate) async fn scrape(addr: SocketAddr) -> Result<BTreeMap<String, f64>, String> {
    let fetch = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut body = Vec::new();
        stream.read_to_end(&mut body).await?;
        Ok::<_, std::io::Error>(body)
    };
    let bytes = tokio::time::timeout(SCRAPE_TIMEOUT, fetch)
        .await
        .map_err(|_| format!("http://{addr}/metrics did not answer in {SCRAPE_TIMEOUT:?}"))?
        .map_err(|e| format!("http://{addr}/metrics: {e}"))?;
    let text = String::from_utf8_lossy(&bytes);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("http://{addr}/metrics: no HTTP header"))?;
    let ok = head.starts_with("HTTP/1.") && head.split_whitespace().nth(1) == Some("200");
    if !ok {
        let status = head.lines().next().unwrap_or_default();
        return Err(format!("http://{addr}/metrics answered {status}"));
    }
    Ok(parse(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_attach_detach_series() {
        let text = "\
# HELP attachdetach_controller_total_volumes Number of volumes in A/D Controller
# TYPE attachdetach_controller_total_volumes gauge
attachdetach_controller_total_volumes{plugin_name=\"kubernetes.io/csi\",state=\"desired_state_of_world\"} 1000
attachdetach_controller_forced_detaches_total 0
storage_operation_duration_seconds_count{operation_name=\"volume_attach\",status=\"success\"} 1000
storage_operation_duration_seconds_bucket{le=\"0.1\"} 3
process_resident_memory_bytes 1.2e7
garbage line
";
        let m = parse(text);
        assert_eq!(m.len(), 3, "{m:?}");
        assert_eq!(
            m.get("attachdetach_controller_total_volumes{plugin_name=\"kubernetes.io/csi\",state=\"desired_state_of_world\"}"),
            Some(&1000.0)
        );
        assert_eq!(
            m.get("attachdetach_controller_forced_detaches_total"),
            Some(&0.0)
        );
    }

    #[tokio::test]
    async fn scrape_reads_a_server_and_names_a_dead_one() {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            assert!(String::from_utf8_lossy(&buf[..n]).starts_with("GET /metrics "));
            s.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nattachdetach_controller_total_volumes 7\n",
            )
            .await
            .unwrap();
        });
        let m = scrape(addr).await.unwrap();
        assert_eq!(m.get("attachdetach_controller_total_volumes"), Some(&7.0));
        server.await.unwrap();

        let dead = free_port().unwrap();
        let err = scrape(dead).await.unwrap_err();
        assert!(err.contains(&dead.to_string()), "{err}");
    }
}
