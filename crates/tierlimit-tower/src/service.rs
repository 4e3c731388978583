//! [`RateLimit`], the service, and the responses it answers by itself.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tierlimit::{Decision, Error, RuleState, Tier};
use tower_service::Service;

use crate::headers::{self, retry_after_secs};
use crate::layer::{MissingKey, Shared};
use crate::route::{Action, Rendered};

/// The rate-limiting service made by [`RateLimitLayer`](crate::RateLimitLayer)
/// around `S`.
///
/// For each request: finds its route (an exempt route, or no route and no
/// default, passes to `S` unchecked), its key, and checks the route's rule
/// set. Admitted requests go to `S` and its response gets the rate-limit
/// headers; anything else is answered here (see the crate docs). Works for
/// any request body; the response body is `S`'s, wrapped in
/// [`ResponseBody`] so the layer's own answers can have one too.
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> RateLimit<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        RateLimit { inner, shared }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// The future of [`RateLimit`]'s responses.
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

impl<S, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    ReqB: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The service that was polled ready goes into the future; this one
        // keeps a clone (tower's usual move for services called later).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let limit = match shared.routes.find(&parts.method, parts.uri.path()) {
                Some(Action::Limit(limit)) => Some(limit),
                Some(Action::Exempt) => None,
                None => shared.routes.default.as_ref(),
            };
            let Some(limit) = limit else {
                let response = inner.call(Request::from_parts(parts, body)).await?;
                return Ok(response.map(ResponseBody::inner));
            };
            let (cost, limit) = (limit.cost, limit.current(&shared.limiter));
            let grpc = is_grpc(&parts.headers);
            let key = match shared.key.extract(&parts) {
                Ok(Some(key)) => key,
                Ok(None) => match &shared.missing_key {
                    MissingKey::Fallback(key) => key.clone(),
                    MissingKey::Reject => {
                        return Ok(bad_request(grpc, "missing_key", "no rate-limit key"));
                    }
                },
                Err(invalid) => return Ok(bad_request(grpc, "invalid_key", invalid.reason())),
            };
            // Every rule's state only when the draft's `RateLimit` shows them.
            let mut rules = Vec::new();
            let checked = if shared.headers.draft() {
                let checked = shared
                    .limiter
                    .check_with_rules(&key, &limit.set, cost, &mut rules);
                checked.await
            } else {
                shared.limiter.check(&key, &limit.set, cost).await
            };
            let decision = match checked {
                Ok(decision) => decision,
                // Only bad input reaches here (Redis faults become decisions).
                // The key is the only input a client controls; anything else
                // (a reload left a named route's cost above its set's
                // capacity) is the server's.
                Err(
                    e @ (Error::EmptyKey | Error::KeyTooLong { .. } | Error::KeyControlChar { .. }),
                ) => return Ok(bad_request(grpc, "invalid_key", &e.to_string())),
                Err(e) => return Ok(misconfigured(grpc, &e.to_string())),
            };
            let pk = shared.partition_key.then_some(key.as_str());
            if !decision.allowed {
                return Ok(denied(&shared, &limit, &decision, &rules, pk, grpc));
            }
            let mut response = inner.call(Request::from_parts(parts, body)).await?;
            headers::render(
                response.headers_mut(),
                shared.headers,
                &limit.set,
                &limit.policy,
                &decision,
                &rules,
                pk,
            );
            Ok(response.map(ResponseBody::inner))
        })
    }
}

/// `content-type: application/grpc`, `application/grpc+proto`, …
fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

const GRPC_INVALID_ARGUMENT: u8 = 3;
const GRPC_RESOURCE_EXHAUSTED: u8 = 8;
const GRPC_INTERNAL: u8 = 13;
const GRPC_UNAVAILABLE: u8 = 14;

/// A denial: 429 (or the fail-closed status) with `Retry-After`, the
/// rate-limit headers and a JSON body; for gRPC a trailers-only response.
fn denied<B>(
    shared: &Shared,
    limit: &Rendered,
    decision: &Decision,
    rules: &[RuleState],
    pk: Option<&str>,
    grpc: bool,
) -> Response<ResponseBody<B>> {
    let fail_closed = decision.tier == Tier::FailClosed;
    let retry = retry_after_secs(decision);
    let (error, message) = if fail_closed {
        (
            "limiter_unavailable",
            "rate limiter unavailable; the request was not admitted",
        )
    } else {
        ("rate_limited", "rate limit exceeded")
    };
    let mut response = if grpc {
        let code = if fail_closed {
            GRPC_UNAVAILABLE
        } else {
            GRPC_RESOURCE_EXHAUSTED
        };
        grpc_response(code, &format!("{message}; retry after {retry} s"))
    } else {
        let status = if fail_closed {
            shared.fail_closed_status
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        json_response(
            status,
            format!(
                r#"{{"error":"{error}","message":"{message}","policy":"{}","retry_after":{retry}}}"#,
                limit.set.name()
            ),
        )
    };
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, retry.into());
    headers::render(
        headers,
        shared.headers,
        &limit.set,
        &limit.policy,
        decision,
        rules,
        pk,
    );
    response
}

/// 400 for a missing or unusable key; for gRPC `INVALID_ARGUMENT`.
fn bad_request<B>(grpc: bool, error: &str, message: &str) -> Response<ResponseBody<B>> {
    error_response(
        grpc,
        StatusCode::BAD_REQUEST,
        GRPC_INVALID_ARGUMENT,
        error,
        message,
    )
}

/// 500 for a route no request could pass (its cost above its rule set's
/// capacity); for gRPC `INTERNAL`.
fn misconfigured<B>(grpc: bool, message: &str) -> Response<ResponseBody<B>> {
    error_response(
        grpc,
        StatusCode::INTERNAL_SERVER_ERROR,
        GRPC_INTERNAL,
        "rate_limit_misconfigured",
        message,
    )
}

fn error_response<B>(
    grpc: bool,
    status: StatusCode,
    grpc_code: u8,
    error: &str,
    message: &str,
) -> Response<ResponseBody<B>> {
    if grpc {
        return grpc_response(grpc_code, message);
    }
    json_response(
        status,
        format!(
            r#"{{"error":"{error}","message":"{}"}}"#,
            message.replace(['"', '\\'], "'")
        ),
    )
}

fn json_response<B>(status: StatusCode, body: String) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::full(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A trailers-only gRPC response: HTTP 200 with `grpc-status` and
/// `grpc-message` among the headers and no body.
fn grpc_response<B>(code: u8, message: &str) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::empty());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", u16::from(code).into());
    if let Ok(message) = HeaderValue::try_from(grpc_percent_encode(message)) {
        headers.insert("grpc-message", message);
    }
    response
}

/// gRPC's `grpc-message` encoding: bytes outside printable ASCII, and `%`,
/// percent-encoded.
fn grpc_percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pin_project! {
    /// The body of [`RateLimit`]'s responses: the inner service's body, or
    /// the layer's own (a JSON error, or empty for gRPC).
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
        }
    }

    fn full(data: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    fn empty() -> Self {
        ResponseBody {
            kind: Kind::Full { data: None },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tierlimit::{HybridLimiter, Rule, RuleSet};

    use super::*;
    use crate::headers::HeaderMode;

    fn shared(headers: HeaderMode, fail_closed_status: StatusCode) -> Shared {
        Shared {
            // Never connects: build() does no I/O and nothing here checks.
            limiter: Arc::new(
                HybridLimiter::builder()
                    .redis_url("redis://127.0.0.1:1/")
                    .build()
                    .expect("a valid limiter config"),
            ),
            key: Box::new(crate::GlobalKey::new("k").expect("a valid key")),
            routes: Default::default(),
            missing_key: MissingKey::Reject,
            headers,
            fail_closed_status,
            partition_key: false,
        }
    }

    #[tokio::test]
    async fn fail_closed_status_is_configurable_and_mode_none_sends_only_retry_after() {
        let set = RuleSet::new("s", [Rule::per_minute(5).expect("valid")]).expect("valid");
        let limit = Rendered::new(set);
        let d = Decision::denied(
            5,
            Duration::from_millis(1500),
            Duration::from_millis(1500),
            0,
            Tier::FailClosed,
        );
        let shared = shared(HeaderMode::None, StatusCode::TOO_MANY_REQUESTS);
        let r: Response<ResponseBody<()>> = denied(&shared, &limit, &d, &[], None, false);
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[RETRY_AFTER], "2");
        assert_eq!(
            r.headers().len(),
            2,
            "content-type and retry-after only: {:?}",
            r.headers()
        );
        let g: Response<ResponseBody<()>> = denied(&shared, &limit, &d, &[], None, true);
        assert_eq!(g.headers()["grpc-status"], "14");
        assert_eq!(
            g.headers()["grpc-message"],
            "rate limiter unavailable; the request was not admitted; retry after 2 s"
        );
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(grpc_percent_encode("100% sure\n"), "100%25 sure%0A");
    }
}
