//! Shared by the layer's HTTP tests: an axum server on a loopback port and a
//! minimal HTTP/1.1 client over a raw `TcpStream` (no client dependency).

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::any;
use tierlimit::{HybridLimiter, Instances};
use tierlimit_tower::RateLimitLayer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A limiter on `url` with one fixed instance (so `LocalFallback` has the whole
/// limit as its share without a heartbeat) and the default 50 ms deadline.
pub fn limiter(url: &str) -> Arc<HybridLimiter> {
    Arc::new(
        HybridLimiter::builder()
            .redis_url(url)
            .instances(Instances::Fixed(1))
            .deadline(DEADLINE)
            .build()
            .expect("a valid limiter config"),
    )
}

pub const DEADLINE: Duration = Duration::from_millis(50);

/// Serves `layer` around a handler answering `200 ok` on every path, with the
/// peer address as `ConnectInfo`; returns its address.
pub async fn serve(layer: RateLimitLayer) -> SocketAddr {
    let app = Router::new()
        .route("/", any(|| async { "ok" }))
        .route("/{*path}", any(|| async { "ok" }))
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("a local address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("the test server runs");
    });
    addr
}

/// A response as read off the wire.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// The value of header `name` (case-insensitive); panics when absent.
    pub fn header(&self, name: &str) -> &str {
        self.get(name)
            .unwrap_or_else(|| panic!("no {name} header in {self:#?}"))
    }

    /// The value of header `name`, if present.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request on a fresh connection and reads the whole response.
pub async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: 0\r\n"
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let mut stream = TcpStream::connect(addr)
        .await
        .expect("connect to the test server");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("write the request");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("the response within 10 s")
        .expect("read the response");
    let raw = String::from_utf8(raw).expect("a UTF-8 response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a response head");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_string(),
    }
}

pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    send(addr, "GET", path, headers).await
}

/// Standard base64 with padding, to compare `pk` parameters.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            out.push(if i <= chunk.len() {
                char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63])
            } else {
                '='
            });
        }
    }
    out
}

/// The `pk` of a `RateLimit` field value, decoded back to the key it names.
pub fn pk_of(reply: &Reply) -> String {
    let field = reply.header("ratelimit");
    let pk = field
        .split(';')
        .find_map(|p| p.strip_prefix("pk=:"))
        .and_then(|p| p.strip_suffix(':'))
        .unwrap_or_else(|| panic!("no pk in {field:?}"));
    pk.to_string()
}
