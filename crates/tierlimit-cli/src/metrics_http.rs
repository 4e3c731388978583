//! Prometheus: the recorder, and `/metrics` served by a small HTTP/1.1
//! responder of our own (the exporter's hyper listener would bring a whole
//! HTTP stack for one GET).

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::Failure;

/// Bucket bounds of `tierlimit_redis_call_seconds`: from 100 µs (a healthy
/// loopback call) to past the default 50 ms deadline, so a dashboard can
/// take quantiles with `histogram_quantile` across instances.
const REDIS_CALL_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];

/// The longest request head read before answering 431.
const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Installs the Prometheus recorder as the process's metrics recorder. Call it
/// before building any limiter: the limiter takes its counters' handles from
/// the recorder installed at its first checks.
pub(crate) fn install() -> Result<PrometheusHandle, Failure> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("tierlimit_redis_call_seconds".into()),
            REDIS_CALL_BUCKETS,
        )
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| Failure::new(format!("cannot install the Prometheus recorder: {e}")))
}

/// Serves `GET /metrics` on `addr` until the returned task is aborted, and
/// runs the recorder's upkeep (histogram and summary maintenance).
pub(crate) async fn serve(
    addr: SocketAddr,
    handle: PrometheusHandle,
) -> Result<(SocketAddr, JoinHandle<()>), Failure> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::new(format!("cannot serve /metrics on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::new(format!("cannot read the /metrics address: {e}")))?;
    let task = tokio::spawn(async move {
        let mut upkeep = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    if let Ok((stream, _)) = accepted {
                        let handle = handle.clone();
                        tokio::spawn(async move {
                            let _ = respond(stream, &handle).await;
                        });
                    } else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                _ = upkeep.tick() => handle.run_upkeep(),
            }
        }
    });
    Ok((bound, task))
}

/// Answers one request and closes the connection.
async fn respond(mut stream: TcpStream, handle: &PrometheusHandle) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let complete = tokio::time::timeout(READ_TIMEOUT, async {
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            head.extend_from_slice(&buf[..n]);
            if head.windows(4).any(|w| w == b"\r\n\r\n") {
                return Ok(true);
            }
            if head.len() > MAX_REQUEST_HEAD {
                return Ok(false);
            }
        }
    })
    .await;
    let (status, content_type, body) = match complete {
        Ok(Ok(true)) => {
            let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
            let mut parts = line.split(|&b| b == b' ');
            let (method, target) = (parts.next(), parts.next());
            let path = target.map(|t| t.split(|&b| b == b'?').next().unwrap_or_default());
            match (method, path) {
                (Some(b"GET"), Some(b"/metrics")) => (
                    "200 OK",
                    "text/plain; version=0.0.4; charset=utf-8",
                    handle.render(),
                ),
                (Some(b"GET"), _) => (
                    "404 Not Found",
                    "text/plain; charset=utf-8",
                    "only /metrics is served here\n".to_owned(),
                ),
                _ => (
                    "405 Method Not Allowed",
                    "text/plain; charset=utf-8",
                    "only GET /metrics is served here\n".to_owned(),
                ),
            }
        }
        Ok(Ok(false)) if head.len() > MAX_REQUEST_HEAD => (
            "431 Request Header Fields Too Large",
            "text/plain; charset=utf-8",
            String::new(),
        ),
        _ => return Ok(()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}
