//! Prometheus metrics (`GET /metrics`, OpenMetrics text): requests by route and status,
//! latency, queue depth, merged backend calls and their sizes.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// One HTTP answer: which route (the router's pattern, `unmatched` for 404s) and its status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

fn latency_histogram() -> Histogram {
    // 1 ms to 16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Every metric the server exports, registered once.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub request_seconds: Family<RouteLabels, Histogram, fn() -> Histogram>,
    pub queue_requests: Gauge,
    pub queue_tokens: Gauge,
    pub queue_wait_seconds: Histogram,
    pub batch_requests: Histogram,
    pub batch_texts: Histogram,
    pub batch_tokens: Histogram,
    pub inference_seconds: Histogram,
    pub texts: Counter,
    pub tokens: Counter,
    pub backend_errors: Counter,
    pub abandoned: Counter,
    pub timeouts: Counter,
    pub ready: Gauge,
    pub load_seconds: Gauge<f64, AtomicU64>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "ruri_http_requests",
            "HTTP requests answered, by route and status",
            requests.clone(),
        );
        let request_seconds: Family<RouteLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "ruri_http_request_duration_seconds",
            "Time from request to response, queue wait included, by route",
            request_seconds.clone(),
        );
        let queue_requests = Gauge::default();
        registry.register(
            "ruri_queue_requests",
            "Requests tokenized and waiting for the model",
            queue_requests.clone(),
        );
        let queue_tokens = Gauge::default();
        registry.register(
            "ruri_queue_tokens",
            "Tokens of the requests waiting for the model",
            queue_tokens.clone(),
        );
        let queue_wait_seconds = latency_histogram();
        registry.register(
            "ruri_queue_wait_seconds",
            "Time a request waited in the queue before its backend call started",
            queue_wait_seconds.clone(),
        );
        let batch_requests = Histogram::new(exponential_buckets(1.0, 2.0, 10));
        registry.register(
            "ruri_batch_requests",
            "Requests merged into one backend call",
            batch_requests.clone(),
        );
        let batch_texts = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        registry.register(
            "ruri_batch_texts",
            "Texts in one backend call",
            batch_texts.clone(),
        );
        let batch_tokens = Histogram::new(exponential_buckets(16.0, 2.0, 14));
        registry.register(
            "ruri_batch_tokens",
            "Tokens (unpadded) in one backend call",
            batch_tokens.clone(),
        );
        let inference_seconds = latency_histogram();
        registry.register(
            "ruri_inference_duration_seconds",
            "Duration of one backend call (all its length-sorted batches)",
            inference_seconds.clone(),
        );
        let texts = Counter::default();
        registry.register("ruri_embedded_texts", "Texts embedded", texts.clone());
        let tokens = Counter::default();
        registry.register(
            "ruri_embedded_tokens",
            "Tokens embedded (prompt and special tokens included)",
            tokens.clone(),
        );
        let backend_errors = Counter::default();
        registry.register(
            "ruri_backend_errors",
            "Backend calls that failed",
            backend_errors.clone(),
        );
        let abandoned = Counter::default();
        registry.register(
            "ruri_abandoned_requests",
            "Queued requests given up before the model took them (client gone, or request timeout)",
            abandoned.clone(),
        );
        let timeouts = Counter::default();
        registry.register(
            "ruri_request_timeouts",
            "Embedding requests answered 503 at the request timeout",
            timeouts.clone(),
        );
        let ready = Gauge::default();
        registry.register(
            "ruri_model_ready",
            "1 once the model is loaded and warmed up",
            ready.clone(),
        );
        let load_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "ruri_model_load_seconds",
            "Time from the start of loading to ready",
            load_seconds.clone(),
        );
        Self {
            registry,
            requests,
            request_seconds,
            queue_requests,
            queue_tokens,
            queue_wait_seconds,
            batch_requests,
            batch_texts,
            batch_tokens,
            inference_seconds,
            texts,
            tokens,
            backend_errors,
            abandoned,
            timeouts,
            ready,
            load_seconds,
        }
    }

    /// Counts one answered request.
    pub fn observe_request(&self, route: &str, status: u16, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.to_owned(),
                status,
            })
            .inc();
        self.request_seconds
            .get_or_create(&RouteLabels {
                route: route.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// The OpenMetrics text of every metric.
    pub fn render(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}
