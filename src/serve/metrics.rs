//! `GET /metrics`: the server's counters in Prometheus' text format (0.0.4), so that a scraper
//! sees what the server is doing: requests by route and status, tokens, each model's requests
//! in flight and queued beyond its batch (what `--max-queue` bounds), batch sizes, and how
//! long generations take. The same per-model count of requests in flight decides admission
//! (429 when the queue is full), so the figures and the back-pressure cannot disagree.
use crate::generate::Usage;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Instant;

/// Upper bounds (seconds) of the generation-duration buckets.
const DURATION_BUCKETS: &[f64] = &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];
/// Upper bounds (seconds) of the time-to-first-token buckets.
const TTFT_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative; summed when written).
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }

    fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cum += c;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

struct ModelStats {
    max_batch: usize,
    in_flight: usize,
    prompt_tokens: u64,
    cached_tokens: u64,
    generated_tokens: u64,
    /// Generations ended, by how: a finish reason, or error / timeout / disconnected.
    outcomes: BTreeMap<&'static str, u64>,
    batch_last: usize,
    batch_sum: u64,
    batch_count: u64,
    duration: Histogram,
    ttft: Histogram,
}

struct State {
    /// HTTP requests answered, by route and status.
    requests: BTreeMap<(String, u16), u64>,
    models: BTreeMap<String, ModelStats>,
}

/// The server's counters (one per server, shared by every request).
pub(crate) struct Metrics {
    state: Mutex<State>,
    max_queue: usize,
    started: Instant,
}

impl Metrics {
    /// Counters for `models` (each id with its session's batch size); each model admits its
    /// batch and `max_queue` more.
    pub(crate) fn new(models: &[(String, usize)], max_queue: usize) -> Self {
        let models = models
            .iter()
            .map(|(id, max_batch)| {
                let s = ModelStats {
                    max_batch: *max_batch,
                    in_flight: 0,
                    prompt_tokens: 0,
                    cached_tokens: 0,
                    generated_tokens: 0,
                    outcomes: BTreeMap::new(),
                    batch_last: 0,
                    batch_sum: 0,
                    batch_count: 0,
                    duration: Histogram::new(DURATION_BUCKETS),
                    ttft: Histogram::new(TTFT_BUCKETS),
                };
                (id.clone(), s)
            })
            .collect();
        Metrics { state: Mutex::new(State { requests: BTreeMap::new(), models }), max_queue, started: Instant::now() }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Counters stay usable even if a thread panicked while holding the lock.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn count_request(&self, route: &str, status: u16) {
        *self.state().requests.entry((route.to_string(), status)).or_default() += 1;
    }

    /// Takes a place for one more request to `model`, or says how many are in flight when its
    /// batch and queue are full.
    pub(crate) fn admit(&self, model: &str) -> Result<(), usize> {
        let mut st = self.state();
        let Some(m) = st.models.get_mut(model) else { return Ok(()) };
        if m.in_flight >= m.max_batch.saturating_add(self.max_queue) {
            return Err(m.in_flight);
        }
        m.in_flight += 1;
        Ok(())
    }

    /// A request admitted by [`Metrics::admit`] is over: how it ended (None: refused before it
    /// started, not counted as a generation), how long it took, how long its first token took
    /// (None: it never got one).
    pub(crate) fn leave(&self, model: &str, outcome: Option<&'static str>, seconds: f64, ttft: Option<f64>) {
        let mut st = self.state();
        let Some(m) = st.models.get_mut(model) else { return };
        m.in_flight = m.in_flight.saturating_sub(1);
        let Some(outcome) = outcome else { return };
        *m.outcomes.entry(outcome).or_default() += 1;
        m.duration.observe(seconds);
        if let Some(t) = ttft {
            m.ttft.observe(t);
        }
    }

    /// A finished generation's token counts and batch size.
    pub(crate) fn usage(&self, model: &str, u: &Usage) {
        let mut st = self.state();
        let Some(m) = st.models.get_mut(model) else { return };
        m.prompt_tokens += u.prompt_tokens as u64;
        m.cached_tokens += u.cached_tokens as u64;
        m.generated_tokens += u.completion_tokens as u64;
        m.batch_last = u.batch_size;
        m.batch_sum += u.batch_size as u64;
        m.batch_count += 1;
    }

    /// Everything, in Prometheus' text format.
    pub(crate) fn render(&self) -> String {
        let st = self.state();
        let mut out = String::new();
        let head = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        head(&mut out, "mlex_uptime_seconds", "gauge", "Seconds since the server started.");
        let _ = writeln!(out, "mlex_uptime_seconds {:.3}", self.started.elapsed().as_secs_f64());
        head(&mut out, "mlex_requests_total", "counter", "HTTP requests answered, by route and status (a stream counts when its headers are sent).");
        for ((route, status), n) in &st.requests {
            let _ = writeln!(out, "mlex_requests_total{{route=\"{}\",status=\"{status}\"}} {n}", escape(route));
        }
        head(&mut out, "mlex_max_queue", "gauge", "Requests a model may queue beyond its batch before the server answers 429 (--max-queue).");
        let _ = writeln!(out, "mlex_max_queue {}", self.max_queue);
        let per_model = |out: &mut String, name: &str, kind: &str, help: &str, value: &dyn Fn(&ModelStats) -> String| {
            head(out, name, kind, help);
            for (id, m) in &st.models {
                let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", escape(id), value(m));
            }
        };
        per_model(&mut out, "mlex_max_batch", "gauge", "Requests a model decodes together.", &|m| m.max_batch.to_string());
        per_model(&mut out, "mlex_requests_in_flight", "gauge", "Generations in flight (queued, prefilling or decoding).", &|m| m.in_flight.to_string());
        per_model(&mut out, "mlex_requests_queued", "gauge", "Generations in flight beyond the model's batch size: the queue depth --max-queue bounds.", &|m| {
            m.in_flight.saturating_sub(m.max_batch).to_string()
        });
        per_model(&mut out, "mlex_prompt_tokens_total", "counter", "Prompt tokens of finished generations.", &|m| m.prompt_tokens.to_string());
        per_model(&mut out, "mlex_cached_prompt_tokens_total", "counter", "Prompt tokens reused from the prompt cache.", &|m| m.cached_tokens.to_string());
        per_model(&mut out, "mlex_generated_tokens_total", "counter", "Tokens generated by finished generations.", &|m| m.generated_tokens.to_string());
        per_model(&mut out, "mlex_batch_size_last", "gauge", "The largest batch the last finished generation decoded in.", &|m| m.batch_last.to_string());
        per_model(&mut out, "mlex_batch_size_average", "gauge", "The mean over finished generations of the largest batch each decoded in.", &|m| {
            let avg = if m.batch_count > 0 { m.batch_sum as f64 / m.batch_count as f64 } else { 0.0 };
            format!("{avg:.3}")
        });
        head(&mut out, "mlex_generations_total", "counter", "Generations ended, by outcome: a finish reason (stop, length, tool_calls), or error, timeout, disconnected.");
        for (id, m) in &st.models {
            for (outcome, n) in &m.outcomes {
                let _ = writeln!(out, "mlex_generations_total{{model=\"{}\",outcome=\"{outcome}\"}} {n}", escape(id));
            }
        }
        head(&mut out, "mlex_generation_duration_seconds", "histogram", "Time from admission to the end of a generation.");
        for (id, m) in &st.models {
            m.duration.write(&mut out, "mlex_generation_duration_seconds", &format!("model=\"{}\"", escape(id)));
        }
        head(&mut out, "mlex_time_to_first_token_seconds", "histogram", "Time from admission to a generation's first token.");
        for (id, m) in &st.models {
            m.ttft.write(&mut out, "mlex_time_to_first_token_seconds", &format!("model=\"{}\"", escape(id)));
        }
        out
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_counts_and_text_format() {
        let m = Metrics::new(&[("a".into(), 2)], 1);
        assert!(m.admit("a").is_ok() && m.admit("a").is_ok() && m.admit("a").is_ok());
        assert_eq!(m.admit("a"), Err(3));
        m.leave("a", Some("stop"), 0.3, Some(0.02));
        assert!(m.admit("a").is_ok());
        m.usage("a", &Usage { prompt_tokens: 5, completion_tokens: 7, batch_size: 3, ..Default::default() });
        m.count_request("/v1/chat/completions", 200);
        let text = m.render();
        for line in [
            "mlex_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1",
            "mlex_requests_in_flight{model=\"a\"} 3",
            "mlex_requests_queued{model=\"a\"} 1",
            "mlex_generated_tokens_total{model=\"a\"} 7",
            "mlex_batch_size_last{model=\"a\"} 3",
            "mlex_generations_total{model=\"a\",outcome=\"stop\"} 1",
            "mlex_generation_duration_seconds_bucket{model=\"a\",le=\"0.5\"} 1",
            "mlex_generation_duration_seconds_bucket{model=\"a\",le=\"0.25\"} 0",
            "mlex_time_to_first_token_seconds_count{model=\"a\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        assert!(text.lines().all(|l| l.starts_with('#') || l.starts_with("mlex_")), "{text}");
    }
}
