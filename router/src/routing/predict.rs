//! Per-worker TTFT model, learned online from observed first-token times.
//!
//! ```text
//! ttft(w) = (queue_tokens(w) + uncached_tokens) / prefill_rate(w) + overhead(w)
//!         = queue_delay(w)   + uncached / rate                     + overhead
//! ```
//!
//! The prefill work already ahead of a request drains at the same prefill rate as the
//! request's own uncached tokens, so the model is linear in `x = queue + uncached` with two
//! parameters, `theta = [seconds per 1,000 tokens, overhead seconds]`. They are fitted per
//! worker to its last `fit_window` (100) first tokens, the line with the least sum of
//! |relative error| (iteratively reweighted least squares, warm-started from the last fit):
//! a 2 s first token counts no more than a 0.2 s one, first tokens delayed by waits the
//! model does not see (evicted history, KV space) move the line no further than their count,
//! and a worker whose speed changes is followed within half a window. Two points on the
//! configured prior (L40S: ~4,800 tokens/s, ~0.05 s) join every fit, so the line starts
//! there and stays put while the samples cannot place it; the result is clamped to sane
//! ranges so absurd samples cannot break routing. The fit replaced recursive least squares
//! with forgetting, whose clipped squared error let a minority of such delayed first tokens
//! pull the line (bench/README.md, "What is left of the simulated prediction error").
//! A prediction also adds a share of the running engine step's remainder (`steps.rs`),
//! which the fit takes off each sample. Time never enters: the caller passes the observed
//! TTFT.
//!
//! A prediction may use a rate pooled over workers of one speed class (InferenceWorkerSet)
//! whose learned rates are close ([`pooled_rates_by_class`], `CoreConfig::rate_pool`,
//! [`Predictor::predict_candidate`]); each fit stays the worker's own.
//!
//! ## Whole engine steps
//!
//! The engine prefills at most `max_num_batched_tokens` per step (the step budget) and a
//! first token comes at the end of a step. A worker that always has more work waiting runs
//! full steps, and then the line above is wrong in two ways: the running step already
//! computes part of the queue, which the line counts again beside the step's remainder; and
//! the request's last, partly filled chunk takes a whole step, because whatever arrives
//! meanwhile fills it. In the default suite's `independent` workload (one prompt length,
//! the KV cache full, 32 clients) the same queue gave first tokens of 0.53 or 0.93 s by
//! that alone. So every worker also fits a second line of the same kind whose tokens are
//! counted in whole steps ([`whole_steps_tokens`]):
//!
//! ```text
//! queue > 0:  tokens = ceil((queue - (running step ? min(queue, budget) : 0) + uncached)
//!                           / budget) * budget
//! queue = 0:  tokens = uncached
//! ```
//!
//! and predictions use it while it has been the better of the two on the worker's recent
//! first tokens: its mean |relative error| over the last `model_choice_window` (50) times
//! `model_choice_margin` (1.5) below the line's. Where steps are mostly not full (light
//! load, short prompts between decodes) it is far worse and the line stays in use; replays
//! of the default suite are in bench/README.md ("Whole engine steps"). The budget is the
//! engine's setting: the worker's own where discovery knows it (`Worker::step_budget_tokens`,
//! from its WorkerSet), else `PredictorConfig::step_budget_tokens` (vLLM V1's default for
//! GPUs under 70 GiB, 2,048); in simulation a wrong budget left the whole-steps line unused.

use std::collections::VecDeque;

use serde::Serialize;

use super::workers::WorkerId;

/// Prior and learning settings.
#[derive(Clone, Debug, Serialize)]
pub struct PredictorConfig {
    /// Prefill tokens per second before any observation.
    pub prior_rate: f64,
    /// Fixed per-request seconds before any observation.
    pub prior_overhead: f64,
    /// Clamp range of the learned rate (tokens/s).
    pub min_rate: f64,
    /// Clamp range of the learned rate (tokens/s).
    pub max_rate: f64,
    /// The learned rate stays within this factor of `prior_rate` either way: a worker's
    /// prefill speed is a property of its GPU and model, which the prior describes; samples
    /// far off it are waits the model does not see, not a different GPU.
    pub rate_range: f64,
    /// Upper clamp of the learned overhead (seconds); the lower one is 0.
    pub max_overhead: f64,
    /// First tokens per worker the fit uses (the latest), beside the prior's two points.
    pub fit_window: usize,
    /// Each sample's error counts relative to max(its observed TTFT, this), so the fit
    /// minimises the relative error rather than the error in seconds (0: in seconds).
    pub relative_fit_floor_s: f64,
    /// Admission wait: weight of each new sample in the running mean of the seconds a
    /// request assigned to a saturated worker waited beyond the prefill model, per request
    /// queued at or ahead of it (0 disables learning it; then no wait is predicted).
    pub admission_learning: f64,
    /// Upper clamp of the learned admission wait per queued request (seconds).
    pub max_admission_wait: f64,
    /// Seconds per output token while decoding, before any observation (KV admission model:
    /// when the router's decoding requests will finish and free their KV).
    pub prior_itl: f64,
    /// Weight of each finished request in the running mean of seconds per output token.
    pub itl_learning: f64,
    /// Prefill tokens an engine step computes at most (vLLM's `max_num_batched_tokens`):
    /// the whole-steps line counts work in steps of it (module docs). 0 turns that line off.
    pub step_budget_tokens: f64,
    /// First tokens over which the two lines' recent errors are compared.
    pub model_choice_window: usize,
    /// The whole-steps line is used while its recent mean |relative error| times this is
    /// below the line's (at least 1).
    pub model_choice_margin: f64,
}

impl Default for PredictorConfig {
    /// L40S serving a ~32B FP8 model (shared/reference/l40s-profile.md): b = 0.21 ms/token.
    fn default() -> Self {
        Self {
            prior_rate: 4_800.0,
            prior_overhead: 0.05,
            min_rate: 100.0,
            max_rate: 1_000_000.0,
            rate_range: 4.0,
            // One engine step plus the network; more means the fit went wrong.
            max_overhead: 1.0,
            fit_window: 100,
            relative_fit_floor_s: 0.05,
            admission_learning: 0.1,
            max_admission_wait: 30.0,
            // ~50 ms per step from reading the weights, more with a batch and prefill chunks.
            prior_itl: 0.07,
            itl_learning: 0.1,
            // vLLM V1's default for GPUs under 70 GiB (8,192 on larger ones).
            step_budget_tokens: 2_048.0,
            model_choice_window: 50,
            model_choice_margin: 1.5,
        }
    }
}

impl PredictorConfig {
    /// `tokens` when it is a step budget the whole-steps line can use (0: off, else 16 to
    /// 1,048,576 tokens), else why not.
    pub fn check_step_budget(tokens: f64) -> Result<f64, String> {
        if tokens == 0.0 || (tokens.is_finite() && (16.0..=1_048_576.0).contains(&tokens)) {
            Ok(tokens)
        } else {
            Err(format!(
                "step budget {tokens}: expected 0 (off) or the engines' max_num_batched_tokens, 16 to 1048576"
            ))
        }
    }
}

/// Running prediction-error figures.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ErrorStats {
    /// Samples recorded.
    pub count: u64,
    /// Sum of |predicted - observed| (seconds).
    pub sum_abs: f64,
    /// Sum of |predicted - observed| / observed.
    pub sum_rel: f64,
    /// Sum of (predicted - observed) (seconds; the sign shows bias).
    pub sum_signed: f64,
    /// Largest absolute error seen (seconds).
    pub max_abs: f64,
}

impl ErrorStats {
    /// Adds one (predicted, observed) pair.
    pub fn record(&mut self, predicted: f64, observed: f64) {
        if !predicted.is_finite() || !observed.is_finite() || observed <= 0.0 {
            return;
        }
        let e = predicted - observed;
        self.count += 1;
        self.sum_abs += e.abs();
        self.sum_rel += e.abs() / observed;
        self.sum_signed += e;
        self.max_abs = self.max_abs.max(e.abs());
    }
    /// Mean absolute error in seconds (0 without samples).
    pub fn mean_abs(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_abs / self.count as f64
        }
    }
    /// Mean relative error (0 without samples).
    pub fn mean_rel(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_rel / self.count as f64
        }
    }
    /// Mean signed error in seconds (positive: predictions too slow).
    pub fn mean_bias(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_signed / self.count as f64
        }
    }
}

/// A line, seconds = tokens / 1,000 * `sec_per_ktok` + `overhead`, fitted to its last
/// `fit_window` samples and the prior's two points.
#[derive(Clone, Debug, Serialize)]
pub struct Line {
    /// Seconds per 1,000 prefill tokens.
    pub sec_per_ktok: f64,
    /// Fixed seconds per request.
    pub overhead: f64,
    /// The last `fit_window` samples.
    #[serde(skip)]
    window: VecDeque<Sample>,
}

/// One worker's fitted model.
#[derive(Clone, Debug, Serialize)]
pub struct WorkerModel {
    /// The line in queue plus uncached tokens.
    #[serde(flatten)]
    pub line: Line,
    /// The line in whole engine steps' tokens ([`whole_steps_tokens`]).
    pub steps_line: Line,
    /// Whether predictions use `steps_line` (it has predicted this worker's recent first
    /// tokens better; module docs).
    pub whole_steps: bool,
    /// Recent |relative error| of the line's and the whole-steps line's predictions.
    #[serde(skip)]
    recent: [RecentErrors; 2],
    /// Samples that updated the model.
    pub samples: u64,
    /// Prediction error of this worker's predictions.
    pub error: ErrorStats,
    /// Learned admission wait per queued request while saturated (seconds).
    pub admission_wait_per_request: f64,
    /// Saturated samples that updated it.
    pub admission_samples: u64,
    /// Learned seconds per output token (first token to finish, per token after the first).
    pub itl: f64,
    /// Finished requests that updated it.
    pub itl_samples: u64,
}

impl WorkerModel {
    fn new(cfg: &PredictorConfig) -> Self {
        Self {
            line: Line::prior(cfg),
            steps_line: Line::prior(cfg),
            whole_steps: false,
            recent: Default::default(),
            samples: 0,
            error: ErrorStats::default(),
            admission_wait_per_request: 0.0,
            admission_samples: 0,
            itl: cfg.prior_itl,
            itl_samples: 0,
        }
    }

    /// Prefill tokens per second (of the line in queue plus uncached tokens).
    pub fn rate(&self) -> f64 {
        self.line.rate()
    }
}

impl Line {
    fn prior(cfg: &PredictorConfig) -> Self {
        Self {
            sec_per_ktok: 1_000.0 / cfg.prior_rate,
            overhead: cfg.prior_overhead,
            window: VecDeque::new(),
        }
    }

    /// Prefill tokens per second.
    pub fn rate(&self) -> f64 {
        1_000.0 / self.sec_per_ktok
    }

    /// Predicted TTFT for `tokens` of prefill.
    pub fn predict_tokens(&self, tokens: f64) -> f64 {
        tokens / 1_000.0 * self.sec_per_ktok + self.overhead
    }

    /// Adds the sample (`tokens` of prefill, a first token of `seconds` of which the
    /// prediction counted `step_s` for the running engine step) and refits.
    fn update(&mut self, cfg: &PredictorConfig, tokens: f64, step_s: f64, seconds: f64) {
        let window = cfg.fit_window.max(1);
        while self.window.len() >= window {
            self.window.pop_front();
        }
        self.window.push_back(Sample {
            x: tokens / 1_000.0,
            y: (seconds - step_s).max(0.0),
            whole: seconds,
        });
        self.refit(cfg);
    }

    /// Refits the line to the window's samples and the prior's two points by iteratively
    /// reweighted least squares, starting from the current line: each point's weight is
    /// 1 / (t^2 * max(|residual| / t, RESIDUAL_FLOOR)) for a first token of t seconds, so
    /// the fit converges to the line with the least sum of |relative error| (a median, not
    /// a mean: first tokens delayed by waits the model does not see move it no further than
    /// their count).
    fn refit(&mut self, cfg: &PredictorConfig) {
        let prior_a = 1_000.0 / cfg.prior_rate;
        let prior = PRIOR_POINTS_KTOK.map(|x| {
            let y = x * prior_a + cfg.prior_overhead;
            Sample { x, y, whole: y }
        });
        let scale = |t: f64| {
            if cfg.relative_fit_floor_s > 0.0 {
                t.max(cfg.relative_fit_floor_s)
            } else {
                1.0
            }
        };
        let (mut a, mut b) = (self.sec_per_ktok, self.overhead);
        for _ in 0..IRLS_ITERATIONS {
            // Weighted normal equations: sums of w x^2, w x, w, w x y, w y.
            let mut m = [0.0; 5];
            for s in self.window.iter().chain(prior.iter()) {
                let sc = scale(s.whole);
                let w = 1.0 / (sc * sc * ((a * s.x + b - s.y) / sc).abs().max(RESIDUAL_FLOOR));
                m[0] += w * s.x * s.x;
                m[1] += w * s.x;
                m[2] += w;
                m[3] += w * s.x * s.y;
                m[4] += w * s.y;
            }
            let det = m[0] * m[2] - m[1] * m[1];
            if !det.is_finite() || det <= m[0] * m[2] * 1e-12 {
                break;
            }
            let mut next = (
                (m[3] * m[2] - m[4] * m[1]) / det,
                (m[0] * m[4] - m[1] * m[3]) / det,
            );
            // An overhead outside its range is fixed at the bound and the rate refitted
            // with it (clamping it afterwards would leave the rate of a line through the
            // wrong point: too slow for long prompts when the overhead wanted to be < 0).
            let bounded = next.1.clamp(0.0, cfg.max_overhead);
            if bounded != next.1 {
                next = ((m[3] - bounded * m[1]) / m[0], bounded);
            }
            if !next.0.is_finite() || !next.1.is_finite() {
                break;
            }
            (a, b) = next;
        }
        let range = cfg.rate_range.max(1.0);
        let lo = 1_000.0 / cfg.max_rate.min(cfg.prior_rate * range);
        let hi = 1_000.0 / cfg.min_rate.max(cfg.prior_rate / range);
        self.sec_per_ktok = clamp_or(a, lo, hi, prior_a);
        self.overhead = clamp_or(b, 0.0, cfg.max_overhead, cfg.prior_overhead);
    }
}

/// Token counts (thousands) of the prior's two points in every fit, on the prior's line:
/// they pin the line until samples spanning a range of sizes arrive, and count as two
/// samples after.
const PRIOR_POINTS_KTOK: [f64; 2] = [0.5, 4.0];
/// Reweighting rounds per refit (each starts from the last line, so few are needed).
const IRLS_ITERATIONS: usize = 8;
/// Smallest relative residual a point's weight divides by: points the line passes within
/// 1% of do not take it over.
const RESIDUAL_FLOOR: f64 = 0.01;

/// The last few |relative errors| of one line's predictions, and their sum.
#[derive(Clone, Debug, Default)]
struct RecentErrors {
    errors: VecDeque<f64>,
    sum: f64,
}

impl RecentErrors {
    fn push(&mut self, error: f64, window: usize) {
        while self.errors.len() >= window.max(1) {
            self.sum -= self.errors.pop_front().unwrap_or(0.0);
        }
        self.errors.push_back(error);
        self.sum += error;
    }

    /// Mean error, `None` before any.
    fn mean(&self) -> Option<f64> {
        (!self.errors.is_empty()).then(|| self.sum.max(0.0) / self.errors.len() as f64)
    }
}

/// Prefill tokens of a request in whole engine steps of `budget` tokens (module docs): with
/// work queued ahead, the work left after the running step, if one runs (`step_running`),
/// takes up to `budget` of the queue, rounded up to whole steps, as others fill the last;
/// with nothing queued, its own uncached tokens. `None` when `budget` is 0 (or not finite):
/// the whole-steps line is off.
pub fn whole_steps_tokens(
    queue_tokens: f64,
    uncached_tokens: f64,
    step_running: bool,
    budget: f64,
) -> Option<f64> {
    if !(budget.is_finite() && budget >= 1.0) {
        return None;
    }
    let queue = if queue_tokens.is_finite() {
        queue_tokens.max(0.0)
    } else {
        0.0
    };
    let own = if uncached_tokens.is_finite() {
        uncached_tokens.max(0.0)
    } else {
        0.0
    };
    if queue <= 0.0 {
        return Some(own);
    }
    let in_running = if step_running { queue.min(budget) } else { 0.0 };
    Some(((queue - in_running + own) / budget).ceil() * budget)
}

/// What the TTFT model predicts for one candidate ([`Predictor::predict_candidate`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Prediction {
    /// Seconds predicted: `line_s`, or the whole-steps line's where the worker uses it.
    pub seconds: f64,
    /// The line's seconds (in queue plus uncached tokens).
    pub line_s: f64,
    /// The whole-steps line's prediction; `None` when it is off.
    pub whole_steps: Option<WholeSteps>,
    /// Whether `seconds` is the whole-steps line's.
    pub used_whole_steps: bool,
}

/// The whole-steps line's prediction for a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct WholeSteps {
    /// Prefill tokens it counted ([`whole_steps_tokens`]).
    pub tokens: f64,
    /// Seconds it predicted.
    pub seconds: f64,
}

impl Prediction {
    /// A prediction of the line alone (the whole-steps line off).
    pub fn line(seconds: f64) -> Self {
        Self {
            seconds,
            line_s: seconds,
            whole_steps: None,
            used_whole_steps: false,
        }
    }
}

/// One first token to learn from ([`Predictor::observe`]).
#[derive(Clone, Copy, Debug)]
pub struct FirstTokenSample {
    /// Prefill tokens queued ahead when the request was assigned, the head's drained tokens
    /// included again (see `drain_s`).
    pub queue_tokens: f64,
    /// Prompt tokens it was expected to compute.
    pub uncached_tokens: f64,
    /// Seconds the prompt at the head of the queue had been prefilling when the request was
    /// assigned, whose tokens the prediction took off the queue at the rate learned then;
    /// `queue_tokens` includes them again. The line learns `(queue + uncached, observed +
    /// drain_s)`: the first token comes that many seconds after the head began, so the pair
    /// holds whatever rate the drain was estimated at. Learned as predicted, a rate far off
    /// the worker's (the prior's, before any sample) drains the wrong number of tokens, and
    /// the fit took the difference as overhead: on the burst shape one idle worker kept
    /// 0.73 s of overhead learned in the first burst (bench/README.md, "Learning from the
    /// queue before the rate is known").
    pub drain_s: f64,
    /// Seconds the prediction counted for the worker's running engine step
    /// (`Candidate::step_s`, `steps.rs`); both lines learn the first token less them, the
    /// error still relative to the whole first token.
    pub step_s: f64,
    /// Seconds predicted in all (the model's, the step's remainder, any admission wait).
    pub predicted: f64,
    /// What the model predicted then (`predicted` less the additions).
    pub model: Prediction,
    /// Seconds the first token took.
    pub observed: f64,
}

impl FirstTokenSample {
    /// A first token the line alone predicted, with nothing drained and no running step.
    pub fn line_only(
        queue_tokens: f64,
        uncached_tokens: f64,
        predicted: f64,
        observed: f64,
    ) -> Self {
        Self {
            queue_tokens,
            uncached_tokens,
            drain_s: 0.0,
            step_s: 0.0,
            predicted,
            model: Prediction::line(predicted),
            observed,
        }
    }
}

/// One first token in a worker's fit window.
#[derive(Clone, Copy, Debug)]
struct Sample {
    /// Queue plus uncached prompt tokens, thousands.
    x: f64,
    /// Seconds the line should give: the observed TTFT with the head's drain added back,
    /// less what the prediction counted for the running engine step.
    y: f64,
    /// The observed TTFT with the drain added back: residuals count relative to it.
    whole: f64,
}

fn clamp_or(v: f64, lo: f64, hi: f64, fallback: f64) -> f64 {
    if v.is_finite() {
        v.clamp(lo, hi)
    } else {
        fallback
    }
}

/// TTFT models of every worker plus pool-wide error figures.
#[derive(Clone, Debug, Default)]
pub struct Predictor {
    cfg: PredictorConfig,
    models: Vec<WorkerModel>,
    error: ErrorStats,
}

impl Predictor {
    /// A predictor whose workers start from `cfg`'s prior.
    pub fn new(cfg: PredictorConfig) -> Self {
        Self {
            cfg,
            models: Vec::new(),
            error: ErrorStats::default(),
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &PredictorConfig {
        &self.cfg
    }

    fn model_mut(&mut self, w: WorkerId) -> &mut WorkerModel {
        let i = w.index();
        if self.models.len() <= i {
            let m = WorkerModel::new(&self.cfg);
            self.models.resize(i + 1, m);
        }
        &mut self.models[i]
    }

    /// Forgets what was learned about `w` (it was retired; its id may be reused): it starts
    /// from the prior again. Pool-wide error figures are kept.
    pub fn forget(&mut self, w: WorkerId) {
        if let Some(m) = self.models.get_mut(w.index()) {
            *m = WorkerModel::new(&self.cfg);
        }
    }

    /// The worker's model, if it has one yet (otherwise the prior applies).
    pub fn model(&self, w: WorkerId) -> Option<&WorkerModel> {
        self.models.get(w.index())
    }

    /// (prefill tokens/s, overhead seconds) for the worker.
    pub fn params(&self, w: WorkerId) -> (f64, f64) {
        match self.model(w) {
            Some(m) => (m.rate(), m.line.overhead),
            None => (self.cfg.prior_rate, self.cfg.prior_overhead),
        }
    }

    /// Predicted TTFT (seconds) on `w` with `queue_tokens` of prefill work ahead and
    /// `uncached_tokens` to compute for the request itself.
    pub fn predict(&self, w: WorkerId, queue_tokens: f64, uncached_tokens: f64) -> f64 {
        let tokens = queue_tokens.max(0.0) + uncached_tokens.max(0.0);
        match self.model(w) {
            Some(m) => m.line.predict_tokens(tokens),
            None => tokens / self.cfg.prior_rate + self.cfg.prior_overhead,
        }
    }

    /// Predicted TTFT of a candidate: the line's at `rate` tokens/s when given (a pooled
    /// rate, [`pooled_rates`]) instead of the worker's learned one, the worker's own overhead
    /// either way; and the whole-steps line's for `steps_tokens` ([`whole_steps_tokens`]),
    /// which `seconds` is where the worker uses it (module docs).
    pub fn predict_candidate(
        &self,
        w: WorkerId,
        queue_tokens: f64,
        uncached_tokens: f64,
        rate: Option<f64>,
        steps_tokens: Option<f64>,
    ) -> Prediction {
        let line_s = match rate {
            Some(rate) => {
                (queue_tokens.max(0.0) + uncached_tokens.max(0.0)) / rate + self.params(w).1
            }
            None => self.predict(w, queue_tokens, uncached_tokens),
        };
        let whole_steps = steps_tokens.map(|tokens| WholeSteps {
            tokens,
            seconds: match self.model(w) {
                Some(m) => m.steps_line.predict_tokens(tokens),
                None => tokens / self.cfg.prior_rate + self.cfg.prior_overhead,
            },
        });
        let used_whole_steps =
            whole_steps.is_some() && self.model(w).is_some_and(|m| m.whole_steps);
        Prediction {
            seconds: match whole_steps {
                Some(s) if used_whole_steps => s.seconds,
                _ => line_s,
            },
            line_s,
            whole_steps,
            used_whole_steps,
        }
    }

    /// Learns from one first token on `w`: records the error of what was predicted, teaches
    /// both lines (the line `(queue + uncached, observed + drain_s - step_s)`, the
    /// whole-steps line its tokens and `observed - step_s`) and notes which predicted it
    /// better. Non-finite or non-positive observations are ignored.
    pub fn observe(&mut self, w: WorkerId, sample: FirstTokenSample) {
        let FirstTokenSample {
            queue_tokens,
            uncached_tokens,
            drain_s,
            step_s,
            predicted,
            model,
            observed,
        } = sample;
        if !observed.is_finite()
            || observed <= 0.0
            || !queue_tokens.is_finite()
            || !uncached_tokens.is_finite()
        {
            return;
        }
        self.error.record(predicted, observed);
        let finite_or_0 = |s: f64| if s.is_finite() { s.max(0.0) } else { 0.0 };
        let step_s = finite_or_0(step_s);
        // What the prediction added to the model's seconds (step, admission wait, penalty):
        // each line's prediction is that plus its own seconds.
        let added = if predicted.is_finite() && model.seconds.is_finite() {
            predicted - model.seconds
        } else {
            step_s
        };
        let Self { cfg, models, .. } = self;
        let i = w.index();
        if models.len() <= i {
            models.resize(i + 1, WorkerModel::new(cfg));
        }
        let m = &mut models[i];
        m.error.record(predicted, observed);
        m.line.update(
            cfg,
            queue_tokens.max(0.0) + uncached_tokens.max(0.0),
            step_s,
            observed + finite_or_0(drain_s),
        );
        let window = cfg.model_choice_window;
        if model.line_s.is_finite() {
            m.recent[0].push((added + model.line_s - observed).abs() / observed, window);
        }
        if let Some(WholeSteps { tokens, seconds }) = model.whole_steps
            && tokens.is_finite()
            && seconds.is_finite()
        {
            m.steps_line.update(cfg, tokens.max(0.0), step_s, observed);
            m.recent[1].push((added + seconds - observed).abs() / observed, window);
        }
        m.whole_steps = match (m.recent[0].mean(), m.recent[1].mean()) {
            (Some(line), Some(steps)) => steps * cfg.model_choice_margin.max(1.0) < line,
            _ => false,
        };
        m.samples += 1;
    }

    /// Seconds per output token on `w` (learned, else the prior).
    pub fn itl(&self, w: WorkerId) -> f64 {
        self.model(w).map_or(self.cfg.prior_itl, |m| m.itl)
    }

    /// Learns the decode speed from a finished request: `seconds` from its first token to its
    /// end, `tokens` output tokens in all. Requests of fewer than 2 tokens teach nothing.
    pub fn observe_decode(&mut self, w: WorkerId, seconds: f64, tokens: u64) {
        if tokens < 2 || !seconds.is_finite() || seconds <= 0.0 {
            return;
        }
        let per = seconds / (tokens - 1) as f64;
        let a = self.cfg.itl_learning.clamp(0.0, 1.0);
        let m = self.model_mut(w);
        // Clamp one sample's pull: a stalled stream must not make the model absurd.
        m.itl = (m.itl + a * (per - m.itl)).clamp(1e-4, 10.0);
        m.itl_samples += 1;
    }

    /// Pool-wide prediction error.
    pub fn error(&self) -> &ErrorStats {
        &self.error
    }

    /// Predicted admission wait (seconds) on a saturated worker (KV full, requests waiting):
    /// the learned wait per queued request times `queued` (the requests at or ahead of this
    /// one). 0 before any saturated sample.
    pub fn admission_wait(&self, w: WorkerId, queued: f64) -> f64 {
        let per = self.model(w).map_or(0.0, |m| m.admission_wait_per_request);
        (per * queued.max(0.0)).max(0.0)
    }

    /// Learns from the first token of a request assigned while `w` was saturated. The
    /// prefill model predicted `base` seconds; what it waited beyond that, per queued request
    /// (`queued`, at least 1), moves the worker's admission wait toward it. The prefill model
    /// itself is not updated: the wait for KV space has nothing to do with prefill speed.
    /// `predicted` (base plus the admission wait) is recorded in the error figures.
    pub fn observe_admission(
        &mut self,
        w: WorkerId,
        queued: f64,
        base: f64,
        predicted: f64,
        observed: f64,
    ) {
        if !observed.is_finite() || observed <= 0.0 || !base.is_finite() || !queued.is_finite() {
            return;
        }
        self.error.record(predicted, observed);
        let learning = self.cfg.admission_learning;
        let max_wait = self.cfg.max_admission_wait;
        let m = self.model_mut(w);
        m.error.record(predicted, observed);
        if learning <= 0.0 {
            return;
        }
        let per = ((observed - base) / queued.max(1.0)).max(0.0);
        let a = learning.clamp(0.0, 1.0);
        let next = m.admission_wait_per_request + a * (per - m.admission_wait_per_request);
        m.admission_wait_per_request = clamp_or(next, 0.0, max_wait, 0.0);
        m.admission_samples += 1;
    }
}

/// The prefill rate each worker's prediction uses instead of its own, given the workers'
/// learned `rates` (same order). With `within` (`CoreConfig::rate_pool`): sorted, rates each
/// at most `1 + within` times the one below form a group, and every member of a group of two
/// or more takes the group's mean seconds per token (the harmonic mean of its rates). `None`
/// for a worker alone, and for all with `within` `None`, negative or not finite.
pub fn pooled_rates(rates: &[f64], within: Option<f64>) -> Vec<Option<f64>> {
    let mut out = vec![None; rates.len()];
    let Some(within) = within.filter(|f| f.is_finite() && *f >= 0.0) else {
        return out;
    };
    let mut order: Vec<usize> = (0..rates.len())
        .filter(|&i| rates[i].is_finite() && rates[i] > 0.0)
        .collect();
    order.sort_by(|&a, &b| rates[a].total_cmp(&rates[b]));
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && rates[order[end]] <= rates[order[end - 1]] * (1.0 + within) {
            end += 1;
        }
        let group = &order[start..end];
        if group.len() > 1 {
            let sec_per_token =
                group.iter().map(|&i| 1.0 / rates[i]).sum::<f64>() / group.len() as f64;
            for &i in group {
                out[i] = Some(1.0 / sec_per_token);
            }
        }
        start = end;
    }
    out
}

/// [`pooled_rates`] within each speed class (`classes[i]` is worker i's; same order as
/// `rates`): workers of different classes never share a rate, however close their rates.
pub fn pooled_rates_by_class(
    rates: &[f64],
    classes: &[&str],
    within: Option<f64>,
) -> Vec<Option<f64>> {
    let mut out = vec![None; rates.len()];
    // Sorted by class, each class one run: O(n log n) however many classes there are.
    let mut order: Vec<usize> = (0..rates.len().min(classes.len())).collect();
    order.sort_by(|&a, &b| classes[a].cmp(classes[b]));
    for members in order.chunk_by(|&a, &b| classes[a] == classes[b]) {
        let sub: Vec<f64> = members.iter().map(|&i| rates[i]).collect();
        for (&i, r) in members.iter().zip(pooled_rates(&sub, within)) {
            out[i] = r;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random stream in [0, 1) for synthetic workloads.
    fn lcg(state: &mut u64) -> f64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*state >> 11) as f64 / (1u64 << 53) as f64
    }

    #[test]
    fn prior_predicts_before_any_sample() {
        let p = Predictor::new(PredictorConfig::default());
        let t = p.predict(WorkerId(0), 0.0, 4_800.0);
        assert!((t - 1.05).abs() < 1e-9, "{t}");
        assert_eq!(p.params(WorkerId(3)), (4_800.0, 0.05));
    }

    #[test]
    fn converges_to_a_synthetic_workers_rate_and_overhead() {
        // True worker: 3,000 tokens/s, 0.12 s overhead, +-5% noise.
        let mut p = Predictor::new(PredictorConfig::default());
        let w = WorkerId(2);
        let mut s = 42;
        let mut late = ErrorStats::default();
        for i in 0..400 {
            let queue = (lcg(&mut s) * 6_000.0).floor();
            let uncached = 100.0 + (lcg(&mut s) * 4_000.0).floor();
            let truth = (queue + uncached) / 3_000.0 + 0.12;
            let observed = truth * (0.95 + 0.1 * lcg(&mut s));
            let predicted = p.predict(w, queue, uncached);
            if i >= 300 {
                late.record(predicted, observed);
            }
            p.observe(
                w,
                FirstTokenSample::line_only(queue, uncached, predicted, observed),
            );
        }
        let (rate, overhead) = p.params(w);
        assert!((rate - 3_000.0).abs() < 150.0, "rate {rate}");
        assert!((overhead - 0.12).abs() < 0.1, "overhead {overhead}");
        assert!(
            late.mean_rel() < 0.05,
            "late relative error {}",
            late.mean_rel()
        );
        // The first predictions (prior 4,800 tok/s) were too fast: the error was recorded.
        let e = p.error();
        assert_eq!(e.count, 400);
        assert!(e.mean_abs() > 0.0 && e.max_abs > late.mean_abs());
        assert!(p.model(w).is_some_and(|m| m.samples == 400));
    }

    #[test]
    fn the_heads_drain_at_a_wrong_rate_does_not_become_overhead() {
        // True worker: 5,900 tokens/s, 0.1 s overhead; the prior says 10,000. A burst's first
        // prompt (17,408 uncached tokens) heads the queue from t = 0 and followers of 1,024
        // uncached tokens arrive over its prefill, every one assigned before the first
        // token of any (so at the rate learned before the burst). The router takes off the
        // queue what the head computed since it began, at that rate.
        let learn = |with_drain: bool, bursts: u32| {
            let cfg = PredictorConfig {
                prior_rate: 10_000.0,
                prior_overhead: 0.1,
                ..PredictorConfig::default()
            };
            let mut p = Predictor::new(cfg);
            let w = WorkerId(0);
            for _ in 0..bursts {
                let rate = p.params(w).0;
                let samples: Vec<_> = (0..16)
                    .map(|i| {
                        let t = 0.2 * f64::from(i);
                        let head = 17_408.0_f64;
                        let drained = (rate * t).min(head);
                        let behind = 1_024.0 * f64::from(i.max(1) - 1);
                        let (queue, uncached) = if i == 0 {
                            (0.0, head)
                        } else {
                            (head - drained + behind, 1_024.0)
                        };
                        let ahead = if i == 0 {
                            0.0
                        } else {
                            (head - 5_900.0 * t).max(0.0) + behind
                        };
                        let truth = (ahead + uncached) / 5_900.0 + 0.1;
                        let predicted = p.predict(w, queue, uncached);
                        (queue, uncached, drained, truth, predicted)
                    })
                    .collect();
                for (queue, uncached, drained, truth, predicted) in samples {
                    if with_drain && drained > 0.0 {
                        p.observe(
                            w,
                            FirstTokenSample {
                                drain_s: drained / rate,
                                ..FirstTokenSample::line_only(
                                    queue + drained,
                                    uncached,
                                    predicted,
                                    truth,
                                )
                            },
                        );
                    } else {
                        p.observe(
                            w,
                            FirstTokenSample::line_only(queue, uncached, predicted, truth),
                        );
                    }
                }
            }
            p.params(w)
        };
        // One burst: the prior's rate was 1.7x too fast for all of it, and the overhead
        // stays near the truth; twenty: both converge.
        let (_, overhead) = learn(true, 1);
        assert!((overhead - 0.1).abs() < 0.1, "overhead {overhead}");
        let (rate, overhead) = learn(true, 20);
        assert!((rate - 5_900.0).abs() < 300.0, "rate {rate}");
        assert!((overhead - 0.1).abs() < 0.05, "overhead {overhead}");
        // Learned as predicted (no drain added back), the recursive least squares this fit
        // replaced put the drain's error into the overhead (0.38 s after one burst, 0.87 s
        // and ~20,000 tokens/s after twenty). The least-|relative error| line does not follow
        // that minority of samples: with or without the drain it ends near the truth.
        let (rate, overhead) = learn(false, 20);
        assert!((rate - 5_900.0).abs() < 300.0, "rate {rate}");
        assert!((overhead - 0.1).abs() < 0.05, "overhead {overhead}");
    }

    #[test]
    fn absurd_samples_are_clamped_or_ignored() {
        let mut p = Predictor::new(PredictorConfig::default());
        let w = WorkerId(0);
        p.observe(w, FirstTokenSample::line_only(0.0, 1_000.0, 0.3, f64::NAN));
        p.observe(w, FirstTokenSample::line_only(0.0, 1_000.0, 0.3, -1.0));
        assert!(p.model(w).is_none());
        for _ in 0..50 {
            p.observe(w, FirstTokenSample::line_only(0.0, 10.0, 0.05, 1e6));
        }
        let (rate, overhead) = p.params(w);
        assert!(
            rate >= 4_800.0 / 4.0 && overhead <= 1.0,
            "{rate} {overhead}"
        );
        assert!(p.predict(w, 0.0, 1.0).is_finite());
    }

    #[test]
    fn unmodelled_waits_do_not_make_an_idle_worker_look_slow() {
        // A saturated worker: first tokens take 8-12 s whatever the prompt (waits for KV
        // space), mixed with some normal samples. Unclipped, such a run drove the fit to
        // "1,000,000 tok/s, 30 s overhead" and nothing was sent to the idle worker again.
        let mut p = Predictor::new(PredictorConfig::default());
        let w = WorkerId(1);
        let mut s = 7;
        for i in 0..500 {
            let tokens = 100.0 + (lcg(&mut s) * 3_000.0).floor();
            let observed = if i % 3 == 0 {
                tokens / 4_800.0 + 0.05
            } else {
                8.0 + 4.0 * lcg(&mut s)
            };
            let predicted = p.predict(w, 0.0, tokens);
            p.observe(
                w,
                FirstTokenSample::line_only(0.0, tokens, predicted, observed),
            );
        }
        let (rate, overhead) = p.params(w);
        assert!((1_200.0..=19_200.0).contains(&rate), "rate {rate}");
        assert!(overhead <= 1.0, "overhead {overhead}");
        let idle = p.predict(w, 0.0, 1_000.0);
        assert!(idle <= 1_000.0 / 1_200.0 + 1.0, "idle prediction {idle}");
        // Back to normal samples: the model recovers.
        for _ in 0..300 {
            let tokens = 100.0 + (lcg(&mut s) * 3_000.0).floor();
            let observed = tokens / 4_800.0 + 0.05;
            let predicted = p.predict(w, 0.0, tokens);
            p.observe(
                w,
                FirstTokenSample::line_only(0.0, tokens, predicted, observed),
            );
        }
        let t = p.predict(w, 0.0, 2_000.0);
        let truth = 2_000.0 / 4_800.0 + 0.05;
        assert!((t - truth).abs() / truth < 0.2, "{t} vs {truth}");
    }

    #[test]
    fn a_few_deep_queues_the_model_misjudges_do_not_skew_every_short_prompt() {
        // A worker at 4,800 tokens/s and 0.05 s. Six in ten requests compute 200-400 tokens,
        // three 1,500-2,500, and one waits behind 8,000-12,000 tokens and takes 60% longer
        // than the line says (something the model does not see). Fitted in seconds, that one
        // in ten pulls the line until the short prompts, most of the traffic, are off by
        // 8% (and by more than 10% with the squared error of the fit this one replaced);
        // fitted on relative error the line is the true one.
        let median_error = |cfg: PredictorConfig| {
            let mut p = Predictor::new(cfg);
            let w = WorkerId(0);
            let mut s = 11;
            let mut errors = Vec::new();
            for i in 0..600 {
                let (tokens, slow) = match i % 10 {
                    0..=5 => (200.0 + (lcg(&mut s) * 200.0).floor(), 1.0),
                    6..=8 => (1_500.0 + (lcg(&mut s) * 1_000.0).floor(), 1.0),
                    _ => (8_000.0 + (lcg(&mut s) * 4_000.0).floor(), 1.6),
                };
                let observed = (tokens / 4_800.0 + 0.05) * slow;
                let predicted = p.predict(w, 0.0, tokens);
                if i >= 300 {
                    errors.push((predicted - observed).abs() / observed);
                }
                p.observe(
                    w,
                    FirstTokenSample::line_only(0.0, tokens, predicted, observed),
                );
            }
            errors.sort_by(f64::total_cmp);
            errors[errors.len() / 2]
        };
        let relative = median_error(PredictorConfig::default());
        let seconds = median_error(PredictorConfig {
            relative_fit_floor_s: 0.0,
            ..PredictorConfig::default()
        });
        assert!(relative < 0.01, "relative fit: {relative}");
        assert!(seconds > 0.05, "fit in seconds: {seconds}");
    }

    #[test]
    fn learns_the_admission_wait_without_touching_the_prefill_model() {
        let mut p = Predictor::new(PredictorConfig::default());
        let w = WorkerId(1);
        assert_eq!(p.admission_wait(w, 3.0), 0.0, "nothing learned yet");
        let before = p.params(w);
        // Saturated requests: 3 queued, prefill model says 0.3 s, they take 0.3 + 3 x 0.4 s.
        for _ in 0..100 {
            let base = p.predict(w, 1_000.0, 200.0);
            let predicted = base + p.admission_wait(w, 3.0);
            p.observe_admission(w, 3.0, base, predicted, base + 1.2);
        }
        let per = p.admission_wait(w, 1.0);
        assert!((per - 0.4).abs() < 1e-3, "{per}");
        assert!((p.admission_wait(w, 2.0) - 0.8).abs() < 2e-3);
        assert_eq!(p.params(w), before, "the prefill model is untouched");
        assert_eq!(p.error().count, 100);
        // Late predictions include the wait: small error.
        assert!(p.model(w).is_some_and(|m| m.admission_samples == 100));
        // Faster than the prefill model alone never makes a negative wait; absurd inputs are
        // ignored; another worker is unaffected.
        for _ in 0..200 {
            p.observe_admission(w, 2.0, 1.0, 1.0, 0.5);
        }
        assert!(
            p.admission_wait(w, 5.0) < 1e-6,
            "{}",
            p.admission_wait(w, 5.0)
        );
        p.observe_admission(w, 2.0, 1.0, 1.0, f64::NAN);
        p.observe_admission(w, f64::INFINITY, 1.0, 1.0, 2.0);
        assert_eq!(p.error().count, 300);
        assert_eq!(p.admission_wait(WorkerId(0), 5.0), 0.0);
    }

    #[test]
    fn the_running_steps_share_is_taken_off_each_sample() {
        // First tokens on the line (4,800 tokens/s, 0.05 s) plus what the prediction
        // counted for the running step, 0-0.4 s: told that share, the fit learns the line;
        // not told, its overhead takes the steps' typical remainder and short prompts miss.
        let learn = |told: bool| {
            let mut p = Predictor::new(PredictorConfig::default());
            let w = WorkerId(0);
            let mut s = 5;
            for _ in 0..300 {
                let tokens = 100.0 + (lcg(&mut s) * 4_000.0).floor();
                let step = 0.4 * lcg(&mut s);
                let observed = tokens / 4_800.0 + 0.05 + step;
                let predicted = p.predict(w, 0.0, tokens) + if told { step } else { 0.0 };
                let step_s = if told { step } else { 0.0 };
                p.observe(
                    w,
                    FirstTokenSample {
                        step_s,
                        model: Prediction::line(predicted - step_s),
                        ..FirstTokenSample::line_only(0.0, tokens, predicted, observed)
                    },
                );
            }
            p.params(w)
        };
        let (rate, overhead) = learn(true);
        assert!((rate - 4_800.0).abs() < 50.0, "rate {rate}");
        assert!((overhead - 0.05).abs() < 0.005, "overhead {overhead}");
        let (_, overhead) = learn(false);
        assert!(overhead > 0.1, "overhead {overhead}");
    }

    #[test]
    fn whole_steps_count_the_running_step_and_round_up() {
        assert_eq!(whole_steps_tokens(100.0, 100.0, true, 0.0), None);
        assert_eq!(whole_steps_tokens(100.0, 100.0, true, f64::NAN), None);
        // Nothing queued: the request's own tokens.
        assert_eq!(whole_steps_tokens(0.0, 300.0, true, 2_048.0), Some(300.0));
        // The running step takes 2,048 of the queue; 2,560 tokens left are two steps.
        assert_eq!(
            whole_steps_tokens(2_304.0, 2_304.0, true, 2_048.0),
            Some(4_096.0)
        );
        // No step running: the whole queue is ahead, three steps.
        assert_eq!(
            whole_steps_tokens(2_304.0, 2_304.0, false, 2_048.0),
            Some(6_144.0)
        );
        // A cached prompt behind a queue the running step holds: nothing left.
        assert_eq!(whole_steps_tokens(500.0, 0.0, true, 2_048.0), Some(0.0));
        assert_eq!(whole_steps_tokens(f64::NAN, -5.0, true, 2_048.0), Some(0.0));
        assert!(PredictorConfig::check_step_budget(0.0).is_ok());
        assert!(PredictorConfig::check_step_budget(8_192.0).is_ok());
        for bad in [4.0, -1.0, f64::INFINITY, f64::NAN, 2e6] {
            assert!(PredictorConfig::check_step_budget(bad).is_err(), "{bad}");
        }
    }

    /// A worker's first tokens over `n` requests, predicted and learned as the core does:
    /// each request sees a running step with `step` seconds left and `queue` tokens ahead,
    /// computes `uncached`, and its first token takes `truth(queue, uncached, step)`.
    /// Returns the mean |relative error| of the second half and the worker's model.
    fn learn_worker(
        cfg: PredictorConfig,
        n: usize,
        seed: u64,
        sample: impl Fn(&mut u64) -> (f64, f64, f64),
        truth: impl Fn(f64, f64, f64) -> f64,
    ) -> (f64, WorkerModel) {
        let budget = cfg.step_budget_tokens;
        let mut p = Predictor::new(cfg);
        let w = WorkerId(0);
        let mut s = seed;
        let mut errors = Vec::new();
        for i in 0..n {
            let (queue, uncached, step) = sample(&mut s);
            let tokens = whole_steps_tokens(queue, uncached, step > 0.0, budget);
            let model = p.predict_candidate(w, queue, uncached, None, tokens);
            let predicted = model.seconds + step;
            let observed = truth(queue, uncached, step);
            if i >= n / 2 {
                errors.push((predicted - observed).abs() / observed);
            }
            p.observe(
                w,
                FirstTokenSample {
                    step_s: step,
                    model,
                    ..FirstTokenSample::line_only(queue, uncached, predicted, observed)
                },
            );
        }
        let m = p.model(w).cloned().expect("learned");
        (errors.iter().sum::<f64>() / errors.len() as f64, m)
    }

    #[test]
    fn a_worker_running_full_steps_is_predicted_in_whole_steps() {
        // The engine computes 2,048 tokens per 0.43 s step. With others queued it stays
        // busy: a running step takes up to 2,048 tokens of the queue, and the request's
        // first token comes at the end of the whole step that finishes it (others fill it).
        // Alone, its last step holds only its own tokens. 2,304-token prompts behind 0-3
        // others, as in the default suite's independent workload; one request in three
        // finds the engine between steps (nothing running, the whole queue ahead).
        let sample = |s: &mut u64| {
            let queue = 2_304.0 * (lcg(s) * 4.0).floor();
            let step = if lcg(s) < 0.33 {
                0.0
            } else {
                0.01 + 0.42 * lcg(s)
            };
            (queue, 2_304.0, step)
        };
        let truth = |queue: f64, uncached: f64, step: f64| {
            let running = if step > 0.0 { queue.min(2_048.0) } else { 0.0 };
            let steps = (queue - running + uncached) / 2_048.0;
            step + if queue > 0.0 { steps.ceil() } else { steps } * 0.43
        };
        let (error, m) = learn_worker(PredictorConfig::default(), 400, 3, sample, truth);
        assert!(m.whole_steps, "predicts in whole steps");
        assert!(error < 0.01, "whole steps: {error}");
        let (line, m) = learn_worker(
            PredictorConfig {
                step_budget_tokens: 0.0,
                ..PredictorConfig::default()
            },
            400,
            3,
            sample,
            truth,
        );
        assert!(!m.whole_steps);
        assert!(line > 0.05, "the line alone: {line}");
    }

    #[test]
    fn a_worker_whose_steps_are_not_full_keeps_the_line() {
        // First tokens on the line (4,800 tokens/s, 0.05 s, plus the running step's
        // remainder): short prompts behind short queues, steps never full. Counted in whole
        // 2,048-token steps they would all look alike; the line stays in use.
        let sample = |s: &mut u64| {
            let queue = (lcg(s) * 1_500.0).floor();
            (queue, 100.0 + (lcg(s) * 400.0).floor(), 0.06 * lcg(s))
        };
        let truth =
            |queue: f64, uncached: f64, step: f64| (queue + uncached) / 4_800.0 + 0.05 + step;
        let (error, m) = learn_worker(PredictorConfig::default(), 400, 9, sample, truth);
        assert!(!m.whole_steps, "keeps the line");
        assert!(error < 0.01, "{error}");
    }

    #[test]
    fn follows_a_worker_that_slows_down() {
        let mut p = Predictor::new(PredictorConfig::default());
        let w = WorkerId(0);
        let mut s = 7;
        for phase_rate in [5_000.0, 2_000.0] {
            for _ in 0..300 {
                let tokens = 200.0 + (lcg(&mut s) * 5_000.0).floor();
                let obs = tokens / phase_rate + 0.05;
                let pred = p.predict(w, 0.0, tokens);
                p.observe(w, FirstTokenSample::line_only(0.0, tokens, pred, obs));
            }
        }
        let (rate, _) = p.params(w);
        assert!((rate - 2_000.0).abs() < 100.0, "{rate}");
    }
}
