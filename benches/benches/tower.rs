//! The tower layer's cost: `RateLimit<S>::call` on a request against a bare `HybridLimiter::check` of the same key, breaker Open, `LocalFallback`.
//!
//! Both sides build the same request (`GET /api/items` with an `x-api-key`
//! header) for every operation, as a server would have one in hand, so the
//! ratio is what the layer adds around the check: route matching, key
//! extraction (a `String` per request), the boxed future, the clone of the
//! inner service, and rendering the headers onto the response. The inner
//! service answers at once with an empty response. The limiter is tripped
//! against a dead port with one fixed instance, so every check is a local
//! admission that never awaits; each side's future is polled once.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::hint::black_box;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Instant;

use http::{Request, Response};
use tierlimit::{LocalConfig, Tier};
use tierlimit_benches::{Case, Harness, generous_set, poll_ready, runtime, tripped_limiter};
use tierlimit_tower::{HeaderKey, HeaderMode, RateLimitLayer};
use tower_service::Service;

const API_KEY: &str = "k-0123456789abcdef";

/// The inner service: an empty `200` at once.
#[derive(Debug, Clone, Copy)]
struct Empty;

impl Service<Request<()>> for Empty {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        ready(Ok(Response::new(())))
    }
}

fn request() -> Request<()> {
    Request::get("/api/items")
        .header("x-api-key", API_KEY)
        .body(())
        .expect("a valid request")
}

fn main() {
    let mut harness = Harness::from_args("tower");
    let rt = runtime();
    let limiter = Arc::new(tripped_limiter(&rt, LocalConfig::default()));
    let set = generous_set("tower", 1);
    let key = format!("api:{API_KEY}");
    let d = poll_ready(limiter.check(&key, &set, 1)).expect("a valid check");
    assert!(
        d.allowed && d.tier == Tier::Local,
        "a local admission: {d:?}"
    );

    for (id, mode) in [
        ("both-headers", HeaderMode::Both),
        ("legacy-headers", HeaderMode::Legacy),
        ("draft-headers", HeaderMode::Draft),
        ("no-headers", HeaderMode::None),
    ] {
        let layer = RateLimitLayer::builder(limiter.clone())
            .key(HeaderKey::api_key("x-api-key").expect("a valid header"))
            .default_route(set.clone(), 1)
            .headers(mode)
            .build()
            .expect("a valid layer");
        let mut service = tower_layer::Layer::layer(&layer, Empty);
        let reply = poll_ready(service.call(request())).expect("infallible");
        assert_eq!(reply.status(), 200, "admitted");
        harness.compare(
            Case::new(
                &format!("layer/{id}"),
                &format!("tower layer over the local check, 1 key, headers: {mode:?}"),
                "RateLimit::call (Open, LocalFallback)",
                "HybridLimiter::check (Open, LocalFallback)",
            ),
            |ops| {
                let mut cx = Context::from_waker(Waker::noop());
                let started = Instant::now();
                for _ in 0..ops {
                    let _ = service.poll_ready(&mut cx);
                    black_box(poll_ready(service.call(request())).ok());
                }
                started.elapsed()
            },
            |ops| {
                let started = Instant::now();
                for _ in 0..ops {
                    let req = black_box(request());
                    black_box(poll_ready(limiter.check(&key, &set, 1)).ok());
                    drop(req);
                }
                started.elapsed()
            },
        );
    }
}
