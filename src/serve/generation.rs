//! One request's generation as the server runs it, whatever API it came through: admitted
//! against its model's batch and queue (429 beyond `--max-queue`), started on the session with
//! a channel for its events, read under the server's deadline (`--request-timeout`: a request
//! past it is aborted), and counted in the metrics when it ends, however it ends (finished,
//! failed, timed out, or its client gone: dropping a [`Generation`] aborts it at the engine's
//! next step, or before it starts when it is still queued).
use super::error::ApiError;
use super::metrics::Metrics;
use super::App;
use crate::generate::engine::{Event, Sink};
use crate::generate::{GenerateOptions, GenerateReply, GeneratedToken, TokenKind};
use crate::{Request, Session};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;

/// What reading a generation gives next.
pub(crate) enum Step {
    Token(GeneratedToken),
    Done(GenerateReply),
    /// It failed, or ran out of time (then it has been aborted); nothing follows.
    Failed(ApiError),
}

/// A running generation.
pub(crate) struct Generation {
    rx: UnboundedReceiver<Event>,
    abort: Arc<AtomicBool>,
    deadline: Option<(tokio::time::Instant, Duration)>,
    slot: Slot,
    session: Session,
    /// Reasoning tokens read so far.
    pub(crate) reasoning_tokens: usize,
}

impl Generation {
    /// Admits and starts `request` on the model `model`: 404 for a model not served, 429 when
    /// its batch and queue are full, 400 for what the session refuses up front.
    pub(crate) fn start(app: &App, model: &str, request: Request, options: GenerateOptions) -> Result<Self, ApiError> {
        let session = app.model(model)?.clone();
        app.metrics.admit(model).map_err(|n| ApiError::queue_full(model, n))?;
        let mut slot = Slot { metrics: app.metrics.clone(), model: model.to_string(), admitted: Instant::now(), first: None, outcome: None };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
        // A reader gone (the client's stream dropped) closes the channel: the engine then stops the request.
        let sink = Sink::new(move |e| tx.send(e).is_ok());
        let abort = Arc::new(AtomicBool::new(false));
        session.start(request, options, abort.clone(), sink)?;
        slot.outcome = Some("disconnected");
        let deadline = app.request_timeout.map(|d| (tokio::time::Instant::now() + d, d));
        Ok(Generation { rx, abort, deadline, slot, session, reasoning_tokens: 0 })
    }

    pub(crate) fn session(&self) -> &Session {
        &self.session
    }

    /// The next token, the reply, or the error that ends it (cancel-safe: a `select!` may drop
    /// it and call again).
    pub(crate) async fn next(&mut self) -> Step {
        let event = match self.deadline {
            Some((at, limit)) => match tokio::time::timeout_at(at, self.rx.recv()).await {
                Ok(e) => e,
                Err(_) => {
                    self.abort.store(true, Ordering::Relaxed);
                    self.slot.outcome = Some("timeout");
                    return Step::Failed(ApiError::timeout(limit.as_secs_f64()));
                }
            },
            None => self.rx.recv().await,
        };
        match event {
            Some(Event::Token(t)) => {
                self.slot.first.get_or_insert_with(Instant::now);
                if t.kind == TokenKind::Reasoning {
                    self.reasoning_tokens += 1;
                }
                Step::Token(t)
            }
            Some(Event::Done(Ok(reply))) => {
                self.slot.first.get_or_insert_with(Instant::now);
                self.slot.metrics.usage(&self.slot.model, &reply.usage);
                self.slot.outcome = Some(reply.finish_reason.as_str());
                Step::Done(reply)
            }
            Some(Event::Done(Err(e))) => {
                self.slot.outcome = Some("error");
                Step::Failed(e.into())
            }
            None => {
                self.slot.outcome = Some("error");
                Step::Failed(crate::Error::SessionClosed.into())
            }
        }
    }

    /// Reads to the end: the whole reply.
    pub(crate) async fn reply(&mut self) -> Result<GenerateReply, ApiError> {
        loop {
            match self.next().await {
                Step::Token(_) => {}
                Step::Done(r) => return Ok(r),
                Step::Failed(e) => return Err(e),
            }
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        // Finished: no effect. Otherwise the engine drops it at its next step, or before it
        // starts when it is still queued.
        self.abort.store(true, Ordering::Relaxed);
    }
}

/// A request's place in its model's count of requests in flight, given back when it ends.
struct Slot {
    metrics: Arc<Metrics>,
    model: String,
    admitted: Instant,
    first: Option<Instant>,
    /// How it ended (None: the session refused it before it started).
    outcome: Option<&'static str>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let ttft = self.first.map(|f| f.duration_since(self.admitted).as_secs_f64());
        self.metrics.leave(&self.model, self.outcome, self.admitted.elapsed().as_secs_f64(), ttft);
    }
}
