//! One exemplar's storage: the latest request behind a histogram bucket or
//! a finished-request counter, and its OpenMetrics suffix
//! ([`crate::exemplar`] attaches the suffixes to the rendered text).

use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use inferscope_schema::stats::RequestRef;
use parking_lot::Mutex;

/// Longest exemplar label set, label names plus values, in characters (OpenMetrics 1.0).
pub const MAX_LABEL_SET_CHARS: usize = 128;
/// The exemplar label of a traced request.
pub const TRACE_ID_LABEL: &str = "trace_id";
/// The exemplar label of an untraced request.
pub const REQUEST_ID_LABEL: &str = "request_id";

/// One stored exemplar.
#[derive(Debug, Clone)]
struct Stored {
    request: RequestRef,
    value: f64,
    at: SystemTime,
}

/// When exemplars set together were observed: the clock, read once, at the
/// first that needs it.
#[derive(Debug, Default)]
pub struct ExemplarTime(Cell<Option<SystemTime>>);

impl ExemplarTime {
    /// The time, read now if it was not yet.
    fn get(&self) -> SystemTime {
        let at = self.0.get().unwrap_or_else(SystemTime::now);
        self.0.set(Some(at));
        at
    }
}

/// The latest exemplar of one bucket or counter.
#[derive(Debug, Default)]
pub struct ExemplarSlot(Mutex<Option<Stored>>);

impl ExemplarSlot {
    /// Keeps `request` as this slot's exemplar with `value`, observed now.
    /// Never waits: if another thread is writing or a scrape is reading the
    /// slot, this observation is not kept (the slot's exemplar is as recent
    /// as the other one).
    ///
    /// A request already in the slot stays with the value and time it came
    /// with: a request's tokens land in the same inter-token bucket one after
    /// another, and replacing the exemplar with itself cost a clock read and
    /// a reference count per token (`docs/results/request-path.md`).
    #[inline]
    pub fn set(&self, request: &RequestRef, value: f64) {
        self.set_at(request, value, &ExemplarTime::default());
    }

    /// [`ExemplarSlot::set`], timed by `at`: the exemplars one request
    /// leaves in several histograms at once share one clock read.
    #[inline]
    pub fn set_at(&self, request: &RequestRef, value: f64, at: &ExemplarTime) {
        if let Some(mut slot) = self.0.try_lock() {
            if slot
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(&s.request.request_id, &request.request_id))
            {
                return;
            }
            *slot = Some(Stored {
                request: request.clone(),
                value,
                at: at.get(),
            });
        }
    }

    /// ` # {label="…"} value timestamp`, or nothing when the slot is empty.
    pub(crate) fn write_suffix(&self, out: &mut String) {
        let Some(s) = self.0.lock().clone() else {
            return;
        };
        out.push_str(" # {");
        write_label(out, &s.request);
        out.push_str("} ");
        push_f64(out, s.value);
        let ts = s.at.duration_since(UNIX_EPOCH).unwrap_or_default();
        let _ = write!(out, " {}.{:03}", ts.as_secs(), ts.subsec_millis());
    }
}

/// `trace_id="<32 hex>"` or `request_id="<id>"`, the id cut so that the
/// label set stays within [`MAX_LABEL_SET_CHARS`].
pub(crate) fn write_label(out: &mut String, r: &RequestRef) {
    if let Some(hex) = r.trace_id_hex() {
        let _ = write!(out, "{TRACE_ID_LABEL}=\"{hex}\"");
        return;
    }
    out.push_str(REQUEST_ID_LABEL);
    out.push_str("=\"");
    let room = MAX_LABEL_SET_CHARS - REQUEST_ID_LABEL.len();
    for c in r.request_id.chars().take(room) {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// An OpenMetrics number: integers keep a `.0`, so the value reads as a float.
fn push_f64(out: &mut String, v: f64) {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        let _ = write!(out, "{v:.1}");
    } else {
        let _ = write!(out, "{v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suffix(slot: &ExemplarSlot) -> String {
        let mut out = String::new();
        slot.write_suffix(&mut out);
        out
    }

    #[test]
    fn a_new_request_replaces_the_exemplar_and_the_same_one_keeps_it() {
        let slot = ExemplarSlot::default();
        assert_eq!(suffix(&slot), "");
        let holds = |exemplar: &str| {
            let got = suffix(&slot);
            assert!(got.starts_with(&format!(" # {exemplar} ")), "{got}");
        };
        let a = RequestRef::new("a", None);
        slot.set(&a, 0.25);
        holds("{request_id=\"a\"} 0.25");
        // The same request again (a clone shares the id): kept as it came.
        slot.set(&a.clone(), 0.5);
        holds("{request_id=\"a\"} 0.25");
        // Another request, even with an equal id string, replaces it.
        slot.set(&RequestRef::new("b", None), 0.75);
        holds("{request_id=\"b\"} 0.75");
        slot.set(&RequestRef::new("b", None), 1.0);
        holds("{request_id=\"b\"} 1.0");
    }

    #[test]
    fn exemplars_set_at_one_time_share_one_clock_read() {
        let at = ExemplarTime::default();
        let slots: Vec<ExemplarSlot> = (0..3).map(|_| ExemplarSlot::default()).collect();
        let r = RequestRef::new("r", None);
        for s in &slots {
            s.set_at(&r, 1.0, &at);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let times: Vec<SystemTime> = slots
            .iter()
            .map(|s| s.0.lock().as_ref().expect("an exemplar").at)
            .collect();
        assert!(times.iter().all(|t| *t == times[0]), "{times:?}");
        // `set` reads the clock itself.
        slots[1].set(&RequestRef::new("later", None), 1.0);
        assert!(slots[1].0.lock().as_ref().expect("an exemplar").at > times[0]);
    }
}
