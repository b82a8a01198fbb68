//! What a rule matches on: the request's facts and the state of its pool's local candidates.

/// Request headers as the engine reads them: one value per name (the first), names compared
/// case-insensitively. The router adapts `http::HeaderMap`; tests use a slice of pairs.
pub trait HeaderSource {
    /// The value of header `name` (lowercase), if present and valid text.
    fn header(&self, name: &str) -> Option<&str>;
}

impl HeaderSource for &[(&str, &str)] {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }
}

impl HeaderSource for () {
    fn header(&self, _name: &str) -> Option<&str> {
        None
    }
}

/// One request as rules see it. Everything is borrowed: building it allocates nothing.
#[derive(Clone, Copy)]
pub struct RequestFacts<'a> {
    /// Pool of the request (`namespace/name`); `None` for a model served outside any pool.
    pub pool: Option<&'a str>,
    /// Verified tenant; `None` for anonymous requests.
    pub tenant: Option<&'a str>,
    /// The model name the client sent (a served name or an alias).
    pub model: &'a str,
    /// The model it resolved to, when different (an alias's target): `models` matches
    /// either.
    pub backend_model: Option<&'a str>,
    /// Labels (classifier labels and client-added ones), lowercase.
    pub labels: &'a [&'a str],
    /// Request headers.
    pub headers: &'a dyn HeaderSource,
    /// Service class (header `x-kvroute-service-class`), if any.
    pub service_class: Option<&'a str>,
    /// Prompt tokens (0 when unknown).
    pub prompt_tokens: u64,
    /// The request's output limit, if it set one.
    pub max_output_tokens: Option<u32>,
}

impl std::fmt::Debug for RequestFacts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestFacts")
            .field("pool", &self.pool)
            .field("tenant", &self.tenant)
            .field("model", &self.model)
            .field("backend_model", &self.backend_model)
            .field("labels", &self.labels)
            .field("service_class", &self.service_class)
            .field("prompt_tokens", &self.prompt_tokens)
            .field("max_output_tokens", &self.max_output_tokens)
            .finish_non_exhaustive()
    }
}

impl<'a> RequestFacts<'a> {
    /// Facts with only a model: no pool, tenant, labels, headers or class.
    pub fn for_model(model: &'a str) -> Self {
        Self {
            pool: None,
            tenant: None,
            model,
            backend_model: None,
            labels: &[],
            headers: &(),
            service_class: None,
            prompt_tokens: 0,
            max_output_tokens: None,
        }
    }
}

/// The local candidates of a request at decision time. A figure is `None` when unknown (no
/// candidate, no prediction, no GPU statistics): a rule's range over it does not match.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolState {
    /// Best (lowest) predicted TTFT, seconds.
    pub best_ttft_s: Option<f64>,
    /// Waiting requests at the candidate with the best predicted TTFT.
    pub best_queue: Option<u32>,
    /// Waiting requests over all candidates.
    pub total_queue: Option<u32>,
    /// Lowest KV cache usage (0-1).
    pub kv_usage_min: Option<f64>,
    /// Mean KV cache usage (0-1).
    pub kv_usage_mean: Option<f64>,
    /// Lowest GPU utilisation (0-1) among candidates that report one.
    pub gpu_usage_min: Option<f64>,
    /// Mean GPU utilisation (0-1) among candidates that report one.
    pub gpu_usage_mean: Option<f64>,
}

/// Folds candidates into a [`PoolState`].
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolStateBuilder {
    best: Option<(f64, u32)>,
    total_queue: u64,
    n: u32,
    kv_min: f64,
    kv_sum: f64,
    gpu_n: u32,
    gpu_min: f64,
    gpu_sum: f64,
}

impl PoolStateBuilder {
    /// Adds one candidate: its predicted TTFT (seconds; NaN when none), waiting requests, KV
    /// usage (0-1) and GPU utilisation (0-1) if reported.
    pub fn add(&mut self, predicted_ttft_s: f64, waiting: u32, kv_usage: f64, gpu: Option<f64>) {
        if predicted_ttft_s.is_finite() && self.best.is_none_or(|(t, _)| predicted_ttft_s < t) {
            self.best = Some((predicted_ttft_s, waiting));
        }
        self.total_queue += u64::from(waiting);
        let kv = if kv_usage.is_finite() { kv_usage } else { 0.0 };
        self.kv_min = if self.n == 0 { kv } else { self.kv_min.min(kv) };
        self.kv_sum += kv;
        self.n += 1;
        if let Some(g) = gpu.filter(|g| g.is_finite()) {
            self.gpu_min = if self.gpu_n == 0 {
                g
            } else {
                self.gpu_min.min(g)
            };
            self.gpu_sum += g;
            self.gpu_n += 1;
        }
    }

    /// The state of the candidates added.
    pub fn finish(&self) -> PoolState {
        let some = |v: f64, n: u32| (n > 0).then_some(v);
        PoolState {
            best_ttft_s: self.best.map(|b| b.0),
            best_queue: self.best.map(|b| b.1),
            total_queue: (self.n > 0).then(|| u32::try_from(self.total_queue).unwrap_or(u32::MAX)),
            kv_usage_min: some(self.kv_min, self.n),
            kv_usage_mean: some(self.kv_sum / f64::from(self.n.max(1)), self.n),
            gpu_usage_min: some(self.gpu_min, self.gpu_n),
            gpu_usage_mean: some(self.gpu_sum / f64::from(self.gpu_n.max(1)), self.gpu_n),
        }
    }
}
