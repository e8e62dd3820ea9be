//! The kubelet's client-side rate limits on its API clients, as client-go's
//! token bucket (`flowcontrol.NewTokenBucketRateLimiter`) holds them: the
//! agent's client waits for `kubeAPIQPS`/`kubeAPIBurst`, its event
//! recorder's for `eventRecordQPS`/`eventBurst`, and the heartbeat (the
//! Lease and node status) goes unthrottled, as the kubelet's
//! `HeartbeatClient` (QPS -1).
//!
//! A throttled client is the same connection as the one it wraps
//! ([`throttled`]): each request first takes a token from the bucket,
//! waiting for one when the bucket is empty, then goes out unchanged. A
//! watch takes one token when it starts, as with client-go.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Request, Response};
use kube::Client;
use kube::client::Body;

/// The token bucket of a client: requests per second and burst, as
/// client-go reads a `rest.Config`'s `QPS` and `Burst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Tokens added per second (`QPS`); 0 takes client-go's default, 5.
    pub qps: u32,
    /// Tokens the bucket holds (`Burst`); 0 takes client-go's default, 10.
    pub burst: u32,
}

impl Rate {
    /// client-go's `DefaultQPS`.
    pub const DEFAULT_QPS: u32 = 5;
    /// client-go's `DefaultBurst`.
    pub const DEFAULT_BURST: u32 = 10;

    /// The governor quota of this rate, client-go's defaults for zeros.
    fn quota(self) -> governor::Quota {
        let or = |v: u32, d: u32| {
            NonZeroU32::new(v).unwrap_or(NonZeroU32::new(d).unwrap_or(NonZeroU32::MIN))
        };
        governor::Quota::per_second(or(self.qps, Self::DEFAULT_QPS))
            .allow_burst(or(self.burst, Self::DEFAULT_BURST))
    }
}

/// `client`'s connection behind a token bucket of `rate`: every request
/// waits for a token first.
#[must_use]
pub fn throttled(client: Client, rate: Rate) -> Client {
    let namespace = client.default_namespace().to_string();
    let service = Throttled {
        client,
        limiter: Arc::new(governor::RateLimiter::direct(rate.quota())),
    };
    Client::new(service, namespace)
}

/// The service under a throttled client: a token, then the wrapped
/// client's request.
#[derive(Clone)]
struct Throttled {
    client: Client,
    limiter: Arc<governor::DefaultDirectRateLimiter>,
}

impl tower::Service<Request<Body>> for Throttled {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The wrapped client queues its requests itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let (client, limiter) = (self.client.clone(), self.limiter.clone());
        Box::pin(async move {
            limiter.until_ready().await;
            client.send(request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_api::FakeApi;

    /// 25 requests through a bucket of 20 a second with a burst of 5: the
    /// 20 past the burst wait for their tokens (at least 0.95 s in all),
    /// and every request reaches the server unchanged.
    #[tokio::test]
    async fn requests_past_the_burst_wait_for_the_rate() {
        let api = FakeApi::default();
        let client = throttled(api.client(), Rate { qps: 20, burst: 5 });
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(client, "default");
        let start = std::time::Instant::now();
        for _ in 0..25 {
            let _ = pods.get_opt("p").await;
        }
        let took = start.elapsed();
        assert!(took >= std::time::Duration::from_millis(950), "{took:?}");
        let seen = api.take_requests();
        assert_eq!(seen.len(), 25);
        assert!(
            seen.iter()
                .all(|r| r.line() == "GET /api/v1/namespaces/default/pods/p")
        );
    }

    #[test]
    fn zeros_take_client_gos_defaults() {
        let q = Rate { qps: 0, burst: 0 }.quota();
        assert_eq!(q.burst_size().get(), Rate::DEFAULT_BURST);
        assert_eq!(
            q.replenish_interval(),
            std::time::Duration::from_millis(200)
        );
    }
}
