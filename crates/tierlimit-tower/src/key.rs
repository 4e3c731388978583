//! Key extractors: which rate-limit key a request counts against.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use http::HeaderName;
use http::request::Parts;

/// A request's key could not be used: the header that carries it is too long
/// or holds bytes a key may not hold. The layer answers 400 (gRPC:
/// `INVALID_ARGUMENT`), never 500.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidKey {
    reason: &'static str,
}

impl InvalidKey {
    /// An invalid key, for `reason` (sent to the client: never include the key).
    pub const fn new(reason: &'static str) -> InvalidKey {
        InvalidKey { reason }
    }

    /// Why the key was refused.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for InvalidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid rate-limit key: {}", self.reason)
    }
}

impl std::error::Error for InvalidKey {}

/// What a key extractor found: `Ok(Some(key))`, `Ok(None)` when the request
/// does not carry this kind of key (the next extractor of a [`FirstOf`] is
/// asked), or `Err` when it carries one that cannot be used (the request is
/// refused with 400; no other extractor is asked, so a client cannot dodge
/// its API key's limit by sending a broken one).
pub type KeyResult = Result<Option<String>, InvalidKey>;

/// Finds the rate-limit key of a request from its head (method, URI, headers,
/// extensions). Bodies are never read.
///
/// Keys carry a prefix naming their kind (`api:`, `user:`, `ip:`) so an API
/// key and a user id that happen to be equal never share a bucket.
///
/// # Examples
///
/// ```
/// use tierlimit_tower::{ClientIp, HeaderKey, KeyExtractor};
///
/// // API key, else user id, else the peer's IP address.
/// let key = HeaderKey::api_key("x-api-key")?
///     .or(HeaderKey::user_id("x-user-id")?)
///     .or(ClientIp::peer());
/// let (parts, ()) = http::Request::builder()
///     .header("x-user-id", "42")
///     .body(())
///     .unwrap()
///     .into_parts();
/// assert_eq!(key.extract(&parts), Ok(Some("user:42".to_string())));
/// # Ok::<(), tierlimit::Error>(())
/// ```
pub trait KeyExtractor: fmt::Debug + Send + Sync + 'static {
    /// The key of the request whose head is `parts`.
    fn extract(&self, parts: &Parts) -> KeyResult;

    /// This extractor, then `next` when this one finds no key.
    fn or<E: KeyExtractor>(self, next: E) -> FirstOf
    where
        Self: Sized,
    {
        FirstOf::new().or(self).or(next)
    }
}

impl KeyExtractor for Box<dyn KeyExtractor> {
    fn extract(&self, parts: &Parts) -> KeyResult {
        (**self).extract(parts)
    }
}

/// The key is the value of a request header, behind a prefix: an API key or a
/// user id set by an authenticating proxy or middleware in front.
///
/// A value longer than [`tierlimit_core::MAX_KEY_LEN`] or holding anything but
/// visible ASCII and spaces is an [`InvalidKey`], and so is a header sent more
/// than once (which copy would count is a guess a client could exploit: a
/// proxy that appends its own after the client's); an empty value or a
/// missing header is no key. The value is stored in Redis as part of the
/// key: put a header that holds a secret behind a hash of your own if that
/// matters.
///
/// The value is taken as it arrives (one folded from several, `a, b`,
/// whole): a client that sends a new one with every request is a new key
/// each time, with a whole quota of its own (and
/// Redis keys of its own until they expire). Key by a header only where
/// something in front sets it and removes what clients sent (an
/// authenticating proxy), or where [`FirstOf`] reaches it only after the
/// value was verified; key unauthenticated traffic by [`ClientIp`].
///
/// # Examples
///
/// ```
/// use tierlimit_tower::{HeaderKey, KeyExtractor};
///
/// let key = HeaderKey::api_key("x-api-key")?;
/// let long = "k".repeat(10 * 1024);
/// let (parts, ()) = http::Request::builder()
///     .header("x-api-key", long)
///     .body(())
///     .unwrap()
///     .into_parts();
/// assert!(key.extract(&parts).is_err());
/// # Ok::<(), tierlimit::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    header: HeaderName,
    prefix: &'static str,
}

impl HeaderKey {
    /// The value of `header` (a header name, in any case), prefixed `api:`.
    /// A name that is no valid header name is
    /// [`InvalidConfig`](tierlimit::Error::InvalidConfig) here.
    pub fn api_key(header: &str) -> tierlimit::Result<HeaderKey> {
        HeaderKey::new(header, "api:")
    }

    /// The value of `header`, prefixed `user:`; errors as
    /// [`api_key`](Self::api_key).
    pub fn user_id(header: &str) -> tierlimit::Result<HeaderKey> {
        HeaderKey::new(header, "user:")
    }

    /// The value of `header`, behind `prefix`. A name that is no valid header
    /// name, or a prefix a key may not hold (a control character, or too
    /// long to leave room for a value), is
    /// [`InvalidConfig`](tierlimit::Error::InvalidConfig) here, not a 400 on
    /// every request.
    pub fn new(header: &str, prefix: &'static str) -> tierlimit::Result<HeaderKey> {
        let header = HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
            tierlimit::Error::InvalidConfig {
                what: format!("key header {header:?}: not a valid HTTP header name"),
            }
        })?;
        if !prefix.is_empty() {
            tierlimit_core::validate_key(prefix).map_err(|e| tierlimit::Error::InvalidConfig {
                what: format!("key prefix {prefix:?}: {e}"),
            })?;
            if prefix.len() >= tierlimit_core::MAX_KEY_LEN {
                return Err(tierlimit::Error::InvalidConfig {
                    what: format!(
                        "key prefix of {} bytes: it leaves no room for a value in a key of at most {} bytes",
                        prefix.len(),
                        tierlimit_core::MAX_KEY_LEN
                    ),
                });
            }
        }
        Ok(HeaderKey { header, prefix })
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, parts: &Parts) -> KeyResult {
        let mut values = parts.headers.get_all(&self.header).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(InvalidKey::new("the key header is sent more than once"));
        }
        let bytes = value.as_bytes();
        if bytes.is_empty() {
            return Ok(None);
        }
        // Refused before anything is copied: a 10 KiB header costs no allocation.
        if bytes.len() + self.prefix.len() > tierlimit_core::MAX_KEY_LEN {
            return Err(InvalidKey::new("the key header is too long"));
        }
        if !bytes.iter().all(|&b| (0x20..0x7f).contains(&b)) {
            return Err(InvalidKey::new(
                "the key header holds control characters or non-ASCII bytes",
            ));
        }
        let value = value
            .to_str()
            .map_err(|_| InvalidKey::new("the key header is not visible ASCII"))?;
        let mut key = String::with_capacity(self.prefix.len() + value.len());
        key.push_str(self.prefix);
        key.push_str(value);
        Ok(Some(key))
    }
}

/// The peer address of a request's connection, as a request extension, for
/// servers other than axum (with axum, enable this crate's `axum` feature and
/// serve with `into_make_service_with_connect_info::<SocketAddr>()`: the
/// layer reads axum's `ConnectInfo<SocketAddr>` as well).
///
/// # Examples
///
/// ```
/// use std::net::SocketAddr;
/// use tierlimit_tower::PeerAddr;
///
/// let mut request = http::Request::new(());
/// let peer: SocketAddr = "192.0.2.7:50000".parse().unwrap();
/// request.extensions_mut().insert(PeerAddr(peer));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The key is the client's IP address, prefixed `ip:`.
///
/// [`ClientIp::peer`] takes the connection's peer address (a [`PeerAddr`]
/// extension, or with the `axum` feature axum's `ConnectInfo<SocketAddr>`).
/// A forwarding header is read only with [`ClientIp::behind_proxies`], and
/// only when the peer is one of the trusted proxies: the address list is
/// walked from the right (the hop the nearest proxy added), past every
/// trusted proxy, and the first address not trusted is the client. Anyone
/// else's forwarding header is ignored, so a client cannot pick its own key
/// by sending one.
///
/// Only the header the trusted proxies write is read: `X-Forwarded-For` by
/// default, `Forwarded` (RFC 7239) with
/// [`reading(ForwardingHeader::Forwarded)`](ClientIp::reading). A proxy
/// passes the other one on as the client sent it, so a limiter that read
/// whichever was present would take a client's own `Forwarded: for=<any
/// address>` for its key, and a fresh one per request would never be
/// limited. A request without a peer address has no key.
///
/// An IPv6 client is keyed by its /64 network by default (what one
/// subscriber or host is usually given: keyed by its whole address, a
/// client could take a fresh key per request from its own /64), another
/// prefix with [`ipv6_prefix`](ClientIp::ipv6_prefix). The key names the
/// network, `ip:2001:db8:1:2::/64`.
///
/// # Examples
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use tierlimit_tower::{ClientIp, KeyExtractor, PeerAddr};
///
/// let proxy: IpAddr = "10.0.0.2".parse().unwrap();
/// let key = ClientIp::behind_proxies([proxy]);
/// let mut request = http::Request::builder()
///     .header("x-forwarded-for", "198.51.100.9, 10.0.0.2")
///     .body(())
///     .unwrap();
/// request.extensions_mut().insert(PeerAddr(SocketAddr::new(proxy, 40000)));
/// let (parts, ()) = request.into_parts();
/// assert_eq!(key.extract(&parts), Ok(Some("ip:198.51.100.9".to_string())));
/// ```
#[derive(Debug, Clone)]
pub struct ClientIp {
    trusted: Vec<IpAddr>,
    header: ForwardingHeader,
    ipv6_prefix: u8,
}

impl Default for ClientIp {
    fn default() -> ClientIp {
        ClientIp {
            trusted: Vec::new(),
            header: ForwardingHeader::default(),
            ipv6_prefix: 64,
        }
    }
}

/// The forwarding header a [`ClientIp`] behind proxies reads: the one its
/// trusted proxies write, and only that one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardingHeader {
    /// `X-Forwarded-For`, appended to by nginx (`$proxy_add_x_forwarded_for`),
    /// HAProxy (`option forwardfor`) and most load balancers.
    #[default]
    XForwardedFor,
    /// `Forwarded` (RFC 7239): its `for=` parameters.
    Forwarded,
}

impl ClientIp {
    /// The connection's peer address; forwarding headers are ignored.
    pub fn peer() -> ClientIp {
        ClientIp::default()
    }

    /// The connection's peer address, or when it is one of `trusted` the
    /// client named by the forwarding headers.
    /// `X-Forwarded-For` is read unless [`reading`](Self::reading) says
    /// otherwise.
    pub fn behind_proxies(trusted: impl IntoIterator<Item = IpAddr>) -> ClientIp {
        ClientIp {
            trusted: trusted.into_iter().map(canonical).collect(),
            ..ClientIp::default()
        }
    }

    /// Keys an IPv6 client by the network of its first `bits` bits (64 by
    /// default; 128 keys each address alone). More than 128 is taken as 128.
    pub fn ipv6_prefix(self, bits: u8) -> ClientIp {
        ClientIp {
            ipv6_prefix: bits.min(128),
            ..self
        }
    }

    /// Reads `header`, the one the trusted proxies write, and no other.
    pub fn reading(self, header: ForwardingHeader) -> ClientIp {
        ClientIp { header, ..self }
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.contains(&canonical(ip))
    }

    fn forwarded_client(&self, parts: &Parts) -> Option<IpAddr> {
        let (name, hop): (&str, fn(&str) -> Option<IpAddr>) = match self.header {
            ForwardingHeader::XForwardedFor => ("x-forwarded-for", |hop| parse_ip(hop.trim())),
            ForwardingHeader::Forwarded => ("forwarded", forwarded_for),
        };
        // Split as bytes: a hop that is not text ends the walk there, where
        // dropping its whole line (`to_str` refuses one such byte) dropped
        // the address the proxy appended to the client's line, and the
        // client took the proxy's key.
        let hops: Vec<Option<IpAddr>> = parts
            .headers
            .get_all(name)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(|h| std::str::from_utf8(h).ok().and_then(hop))
            .collect();
        let mut client = None;
        for hop in hops.into_iter().rev() {
            // An address a trusted proxy could not vouch for ends the walk:
            // everything left of it was written by someone untrusted.
            let ip = hop?;
            client = Some(ip);
            if !self.is_trusted(ip) {
                break;
            }
        }
        client
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, parts: &Parts) -> KeyResult {
        let Some(peer) = peer_ip(parts) else {
            return Ok(None);
        };
        let ip = if !self.trusted.is_empty() && self.is_trusted(peer) {
            self.forwarded_client(parts).unwrap_or(peer)
        } else {
            peer
        };
        Ok(Some(match canonical(ip) {
            IpAddr::V6(v6) if self.ipv6_prefix < 128 => {
                let bits = u32::from(self.ipv6_prefix);
                let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
                let network = std::net::Ipv6Addr::from(u128::from(v6) & mask);
                format!("ip:{network}/{bits}")
            }
            ip => format!("ip:{ip}"),
        }))
    }
}

/// The peer's address from a [`PeerAddr`] extension, or axum's `ConnectInfo`.
fn peer_ip(parts: &Parts) -> Option<IpAddr> {
    if let Some(PeerAddr(addr)) = parts.extensions.get::<PeerAddr>() {
        return Some(addr.ip());
    }
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(addr.ip());
    }
    None
}

/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, what a dual-stack socket
/// reports for IPv4 peers) as the IPv4 address, so one client has one key.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// An address as forwarding headers write it: bare, `ip:port`, `[v6]` or
/// `[v6]:port`.
fn parse_ip(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    s.strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .and_then(|s| s.parse().ok())
}

/// The `for=` node of one `Forwarded` element (RFC 7239), when it is an address.
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.trim().split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("for") {
            return None;
        }
        parse_ip(value.trim().trim_matches('"'))
    })
}

/// The same key for every request: one limit shared by all clients (a
/// global budget for an expensive endpoint).
///
/// # Examples
///
/// ```
/// use tierlimit_tower::{GlobalKey, KeyExtractor};
///
/// let (parts, ()) = http::Request::new(()).into_parts();
/// let key = GlobalKey::new("global")?;
/// assert_eq!(key.extract(&parts), Ok(Some("global".to_string())));
/// assert!(GlobalKey::new("").is_err());
/// # Ok::<(), tierlimit::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct GlobalKey {
    key: String,
}

impl GlobalKey {
    /// Every request counts against `key`; the key's error (empty, too
    /// long, a control character) here, not a 400 on every request.
    pub fn new(key: impl Into<String>) -> tierlimit::Result<GlobalKey> {
        let key = key.into();
        tierlimit_core::validate_key(&key)?;
        Ok(GlobalKey { key })
    }
}

impl KeyExtractor for GlobalKey {
    fn extract(&self, _parts: &Parts) -> KeyResult {
        Ok(Some(self.key.clone()))
    }
}

/// Tries extractors in order; the first key found wins. An [`InvalidKey`]
/// from any of them ends the search (see [`KeyResult`]). Built with
/// [`KeyExtractor::or`].
#[derive(Debug, Default)]
pub struct FirstOf {
    extractors: Vec<Box<dyn KeyExtractor>>,
}

impl FirstOf {
    /// No extractor yet: finds no key.
    pub fn new() -> FirstOf {
        FirstOf::default()
    }

    /// Appends `next`.
    pub fn or<E: KeyExtractor>(mut self, next: E) -> FirstOf {
        self.extractors.push(Box::new(next));
        self
    }
}

impl KeyExtractor for FirstOf {
    fn extract(&self, parts: &Parts) -> KeyResult {
        for extractor in &self.extractors {
            if let Some(key) = extractor.extract(parts)? {
                return Ok(Some(key));
            }
        }
        Ok(None)
    }

    fn or<E: KeyExtractor>(self, next: E) -> FirstOf {
        FirstOf::or(self, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &str)], peer: Option<&str>) -> Parts {
        let mut builder = http::Request::builder();
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let mut request = builder.body(()).expect("a valid request");
        if let Some(peer) = peer {
            let addr: SocketAddr = peer.parse().expect("a socket address");
            request.extensions_mut().insert(PeerAddr(addr));
        }
        request.into_parts().0
    }

    fn seed() -> FirstOf {
        HeaderKey::api_key("x-api-key")
            .expect("a valid header")
            .or(HeaderKey::user_id("x-user-id").expect("a valid header"))
            .or(ClientIp::peer())
    }

    /// A header name in capitals (as HTTP documents write them) is the same
    /// header; a name that is none, or a prefix no key may hold, is refused
    /// here. Before, the first panicked and the second answered 400 to every
    /// request, blaming the client.
    #[test]
    fn a_header_key_is_checked_when_made() {
        let key = HeaderKey::api_key("X-Api-Key").expect("any case");
        let head = parts(&[("x-api-key", "k1")], None);
        assert_eq!(key.extract(&head), Ok(Some("api:k1".into())));
        for (header, prefix) in [("x api key", "api:"), ("", "api:"), ("x-k", "a\tb:")] {
            assert!(
                matches!(
                    HeaderKey::new(header, prefix),
                    Err(tierlimit::Error::InvalidConfig { .. })
                ),
                "{header:?} {prefix:?}"
            );
        }
        let long: &'static str = "p".repeat(tierlimit_core::MAX_KEY_LEN).leak();
        assert!(HeaderKey::new("x-k", long).is_err());
    }

    #[test]
    fn api_key_beats_user_id_beats_ip() {
        let key = seed();
        let all = parts(
            &[("x-api-key", "k1"), ("x-user-id", "u1")],
            Some("192.0.2.1:1"),
        );
        assert_eq!(key.extract(&all), Ok(Some("api:k1".into())));
        let user = parts(&[("x-user-id", "u1")], Some("192.0.2.1:1"));
        assert_eq!(key.extract(&user), Ok(Some("user:u1".into())));
        let ip = parts(&[], Some("192.0.2.1:1"));
        assert_eq!(key.extract(&ip), Ok(Some("ip:192.0.2.1".into())));
        assert_eq!(key.extract(&parts(&[], None)), Ok(None));
    }

    #[test]
    fn a_bad_api_key_is_refused_not_skipped() {
        let key = seed();
        let long = "k".repeat(10 * 1024);
        let p = parts(
            &[("x-api-key", &long), ("x-user-id", "u1")],
            Some("192.0.2.1:1"),
        );
        assert!(key.extract(&p).is_err());
        let tab = parts(&[("x-api-key", "a\tb")], None);
        assert!(key.extract(&tab).is_err());
    }

    /// A key header sent twice (the client's, then a proxy's appended) is
    /// refused: the first copy, the client's, was the key, so a client could
    /// pick its own.
    #[test]
    fn a_key_header_sent_twice_is_refused() {
        let key = seed();
        let twice = parts(
            &[("x-api-key", "client-chose"), ("x-api-key", "proxy-set")],
            Some("192.0.2.1:1"),
        );
        let e = key.extract(&twice).expect_err("an ambiguous key");
        assert!(e.to_string().contains("more than once"), "{e}");
        let once = parts(&[("x-api-key", "proxy-set")], Some("192.0.2.1:1"));
        assert_eq!(key.extract(&once), Ok(Some("api:proxy-set".into())));
    }

    #[test]
    fn forwarded_headers_count_only_from_trusted_proxies() {
        let proxy: IpAddr = "10.0.0.2".parse().expect("an address");
        let key = ClientIp::behind_proxies([proxy]);
        let spoofed = parts(&[("x-forwarded-for", "203.0.113.5")], Some("192.0.2.1:1"));
        assert_eq!(key.extract(&spoofed), Ok(Some("ip:192.0.2.1".into())));
        assert_eq!(
            ClientIp::peer().extract(&parts(
                &[("x-forwarded-for", "203.0.113.5")],
                Some("10.0.0.2:1")
            )),
            Ok(Some("ip:10.0.0.2".into()))
        );
        // The client put a fake hop first; the proxy appended the real peer.
        let via = parts(
            &[("x-forwarded-for", "1.2.3.4, 203.0.113.5")],
            Some("10.0.0.2:1"),
        );
        assert_eq!(key.extract(&via), Ok(Some("ip:203.0.113.5".into())));
        let fwd = parts(
            &[(
                "forwarded",
                "for=1.2.3.4, for=\"[2001:db8::1]:4711\";proto=https",
            )],
            Some("10.0.0.2:1"),
        );
        let by_forwarded = key.clone().reading(ForwardingHeader::Forwarded);
        assert_eq!(
            by_forwarded.extract(&fwd),
            Ok(Some("ip:2001:db8::/64".into()))
        );
        // The header the proxies do not write is the client's: not read.
        assert_eq!(key.extract(&fwd), Ok(Some("ip:10.0.0.2".into())));
        assert_eq!(by_forwarded.extract(&via), Ok(Some("ip:10.0.0.2".into())));
        // A byte that is not visible ASCII in the client's part of the line
        // the proxy appended to.
        let mut binary = parts(&[], Some("10.0.0.2:1"));
        binary.headers.insert(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(b"\xff, 203.0.113.5").expect("a header value"),
        );
        assert_eq!(key.extract(&binary), Ok(Some("ip:203.0.113.5".into())));
        let garbage = parts(&[("x-forwarded-for", "nonsense")], Some("10.0.0.2:1"));
        assert_eq!(key.extract(&garbage), Ok(Some("ip:10.0.0.2".into())));
        let mapped = parts(&[], Some("[::ffff:192.0.2.9]:1"));
        assert_eq!(
            ClientIp::peer().extract(&mapped),
            Ok(Some("ip:192.0.2.9".into()))
        );
    }

    /// Addresses of one /64 share a key: keyed one by one, a client rotating
    /// through its own /64 was never limited.
    #[test]
    fn ipv6_clients_are_keyed_by_their_network() {
        let a = parts(&[], Some("[2001:db8:1:2::a]:1"));
        let b = parts(&[], Some("[2001:db8:1:2:ffff::b]:1"));
        let other = parts(&[], Some("[2001:db8:1:3::a]:1"));
        let key = ClientIp::peer();
        assert_eq!(key.extract(&a), Ok(Some("ip:2001:db8:1:2::/64".into())));
        assert_eq!(key.extract(&a), key.extract(&b));
        assert_ne!(key.extract(&a), key.extract(&other));
        let each = ClientIp::peer().ipv6_prefix(128);
        assert_eq!(each.extract(&a), Ok(Some("ip:2001:db8:1:2::a".into())));
        let wide = ClientIp::peer().ipv6_prefix(48);
        assert_eq!(wide.extract(&other), Ok(Some("ip:2001:db8:1::/48".into())));
        assert_eq!(
            ClientIp::peer().ipv6_prefix(0).extract(&a),
            Ok(Some("ip:::/0".into()))
        );
        // IPv4 is not touched.
        let v4 = parts(&[], Some("192.0.2.9:1"));
        assert_eq!(key.extract(&v4), Ok(Some("ip:192.0.2.9".into())));
    }
}
