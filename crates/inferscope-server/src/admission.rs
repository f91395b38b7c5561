//! Admission control: refuse work the engines cannot start soon, with a 429
//! and a count by reason, rather than queue it without bound.
//!
//! Two limits, both optional:
//! - `--max-waiting-requests`: requests waiting in the engines' queues (read
//!   from the cores' published state);
//! - `--max-queued-tokens`: prompt tokens of choices admitted here whose first
//!   output has not arrived yet. The server counts these itself (an atomic):
//!   a choice's tokens are reserved on admission and released when its first
//!   token or its finish arrives, or when it is dropped — so the count covers
//!   requests still in flight to a core as well as those in its queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::ApiError;

/// The `reason` label of a rejection for too many waiting requests.
pub const REASON_MAX_WAITING_REQUESTS: &str = "max_waiting_requests";
/// The `reason` label of a rejection for too many queued prompt tokens.
pub const REASON_MAX_QUEUED_TOKENS: &str = "max_queued_tokens";

/// The limits and the queued-token count.
#[derive(Debug, Default)]
pub struct Admission {
    max_waiting_requests: Option<usize>,
    max_queued_tokens: Option<usize>,
    queued_tokens: Arc<AtomicUsize>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// `limit` requests are already waiting.
    MaxWaitingRequests {
        /// The configured limit.
        limit: usize,
    },
    /// Admitting `asked` more prompt tokens would exceed `limit`.
    MaxQueuedTokens {
        /// The configured limit.
        limit: usize,
        /// Tokens already queued.
        queued: usize,
        /// The request's prompt tokens (over all its choices).
        asked: usize,
    },
}

impl Rejection {
    /// The `reason` label: a constant, never request data.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MaxWaitingRequests { .. } => REASON_MAX_WAITING_REQUESTS,
            Self::MaxQueuedTokens { .. } => REASON_MAX_QUEUED_TOKENS,
        }
    }

    /// The 429 answered to the client.
    pub fn to_api_error(&self) -> ApiError {
        ApiError::overloaded(match self {
            Self::MaxWaitingRequests { limit } => format!(
                "the server is overloaded: {limit} requests are already waiting; retry later"
            ),
            Self::MaxQueuedTokens {
                limit,
                queued,
                asked,
            } => format!(
                "the server is overloaded: {queued} prompt tokens are queued and this request adds {asked} (limit {limit}); retry later"
            ),
        })
    }
}

impl Admission {
    /// Admission with the given limits (`None`: unlimited).
    pub fn new(max_waiting_requests: Option<usize>, max_queued_tokens: Option<usize>) -> Self {
        Self {
            max_waiting_requests,
            max_queued_tokens,
            queued_tokens: Arc::default(),
        }
    }

    /// Prompt tokens admitted whose first output has not arrived yet.
    pub fn queued_tokens(&self) -> usize {
        self.queued_tokens.load(Ordering::Acquire)
    }

    /// Admits a request whose choices have `per_choice` prompt tokens each,
    /// given `waiting` requests in the engines' queues. On success every
    /// choice gets its reservation, released when dropped.
    pub fn admit(
        &self,
        per_choice: &[usize],
        waiting: usize,
    ) -> Result<Vec<Reservation>, Rejection> {
        if let Some(limit) = self.max_waiting_requests
            && waiting >= limit
        {
            return Err(Rejection::MaxWaitingRequests { limit });
        }
        let asked: usize = per_choice.iter().sum();
        // Reserve first, then check: two racing requests can then both see
        // each other and both be refused, but never both slip past the limit.
        let before = self.queued_tokens.fetch_add(asked, Ordering::AcqRel);
        if let Some(limit) = self.max_queued_tokens
            // An idle queue takes any request, so that one prompt longer
            // than the limit is not refused for ever.
            && before > 0
            && before.saturating_add(asked) > limit
        {
            self.queued_tokens.fetch_sub(asked, Ordering::AcqRel);
            return Err(Rejection::MaxQueuedTokens {
                limit,
                queued: before,
                asked,
            });
        }
        Ok(per_choice
            .iter()
            .map(|&tokens| Reservation {
                counter: self.queued_tokens.clone(),
                tokens,
            })
            .collect())
    }
}

/// One choice's prompt tokens counted as queued; dropping it releases them.
#[derive(Debug)]
pub struct Reservation {
    counter: Arc<AtomicUsize>,
    tokens: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.tokens, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_limit() {
        let a = Admission::new(Some(2), None);
        assert!(a.admit(&[5], 1).is_ok());
        let err = a.admit(&[5], 2).expect_err("full");
        assert_eq!(err.reason(), "max_waiting_requests");
        assert_eq!(err.to_api_error().status.as_u16(), 429);
    }

    #[test]
    fn queued_tokens_are_reserved_and_released() {
        let a = Admission::new(None, Some(100));
        let first = a.admit(&[30, 30], 0).expect("room");
        assert_eq!(a.queued_tokens(), 60);
        let second = a.admit(&[40], 0).expect("exactly at the limit");
        assert_eq!(a.queued_tokens(), 100);
        let err = a.admit(&[1], 0).expect_err("over");
        assert_eq!(
            err,
            Rejection::MaxQueuedTokens {
                limit: 100,
                queued: 100,
                asked: 1
            }
        );
        assert_eq!(err.reason(), "max_queued_tokens");
        assert_eq!(a.queued_tokens(), 100, "a refusal reserves nothing");
        drop(first);
        assert_eq!(a.queued_tokens(), 40);
        drop(second);
        assert_eq!(a.queued_tokens(), 0);
        // An idle queue admits a prompt longer than the limit.
        let big = a.admit(&[500], 0).expect("idle queue");
        assert!(a.admit(&[1], 0).is_err());
        drop(big);
        assert_eq!(a.queued_tokens(), 0);
    }
}
