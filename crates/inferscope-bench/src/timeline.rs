//! A run over time: client-side time series (requests in flight, output
//! tokens/s, TTFT by second of arrival) and `--slice-duration` windows.
//!
//! Slicing assigns each request to the window of its **send time** (`start`,
//! its arrival at the server), never its completion: a window's latencies are
//! those of the requests that arrived in it, so queueing that builds up under
//! saturation shows in the window where the load arrived. A window's
//! throughputs are the tokens (requests) of its requests divided by the
//! window's length.

use crate::client::RequestOutput;
use crate::statistics::{self, BenchmarkMetrics, Slo};

/// Width of the time-series bins, seconds: 1 s; finer for runs shorter than
/// 10 s (about 10 bins or more), wider for long runs (at most about 300 bins).
pub fn bin_width(duration_s: f64) -> f64 {
    if !(duration_s.is_finite() && duration_s > 0.0) {
        1.0
    } else if duration_s < 10.0 {
        crate::plot::nice_step(duration_s, 10.0)
    } else if duration_s > 300.0 {
        crate::plot::nice_step(duration_s, 300.0).max(1.0)
    } else {
        1.0
    }
}

/// Client-side series over the run; x is seconds since the start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientSeries {
    /// Bin width, seconds.
    pub bin_s: f64,
    /// Successful requests in flight, sampled at each bin's start.
    pub in_flight: Vec<(f64, f64)>,
    /// Output tokens (choice-bearing events) received per second, per bin.
    pub output_tps: Vec<(f64, f64)>,
    /// Mean TTFT (ms) of the requests sent in each bin (bins without requests skipped).
    pub ttft_mean_ms: Vec<(f64, f64)>,
    /// Highest TTFT (ms) of the requests sent in each bin.
    pub ttft_max_ms: Vec<(f64, f64)>,
}

/// Builds the client series of a run lasting `duration_s`.
pub fn client_series(outputs: &[RequestOutput], duration_s: f64) -> ClientSeries {
    client_series_binned(outputs, duration_s, bin_width(duration_s))
}

/// [`client_series`] with bins of `bin` seconds.
pub fn client_series_binned(outputs: &[RequestOutput], duration_s: f64, bin: f64) -> ClientSeries {
    let bin = if bin > 0.0 && bin.is_finite() {
        bin
    } else {
        1.0
    };
    let end = outputs
        .iter()
        .filter(|o| o.success)
        .map(|o| o.start + o.latency)
        .fold(duration_s.max(0.0), f64::max);
    let n = ((end / bin).ceil() as usize).max(1);
    let mut tokens = vec![0u64; n];
    let mut ttft: Vec<(f64, f64, u32)> = vec![(0.0, 0.0, 0); n];
    let mut edges: Vec<(f64, i32)> = Vec::new();
    let slot = |t: f64| ((t.max(0.0) / bin) as usize).min(n - 1);
    for o in outputs.iter().filter(|o| o.success) {
        edges.push((o.start, 1));
        edges.push((o.start + o.latency, -1));
        let mut t = o.start + o.ttft;
        tokens[slot(t)] += 1;
        for gap in &o.itl {
            t += gap;
            tokens[slot(t)] += 1;
        }
        let e = &mut ttft[slot(o.start)];
        let ms = o.ttft * 1000.0;
        *e = (e.0 + ms, e.1.max(ms), e.2 + 1);
    }
    // Ends before starts at the same instant: the intervals are half-open.
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut in_flight = Vec::with_capacity(n + 1);
    let (mut cur, mut k) = (0i32, 0usize);
    for i in 0..=n {
        let t = i as f64 * bin;
        while k < edges.len() && edges[k].0 <= t {
            cur += edges[k].1;
            k += 1;
        }
        in_flight.push((t, f64::from(cur)));
    }
    let mut s = ClientSeries {
        bin_s: bin,
        in_flight,
        ..Default::default()
    };
    for (i, (&tok, &(sum, max, cnt))) in tokens.iter().zip(&ttft).enumerate() {
        let t = i as f64 * bin;
        s.output_tps.push((t, tok as f64 / bin));
        if cnt > 0 {
            s.ttft_mean_ms.push((t, sum / f64::from(cnt)));
            s.ttft_max_ms.push((t, max));
        }
    }
    s
}

/// One time window of a run.
#[derive(Debug, Clone)]
pub struct Slice {
    /// Window start, seconds since the start of the run.
    pub start_s: f64,
    /// Window end (the last window ends at the run's end).
    pub end_s: f64,
    /// Every figure of the report, over the requests sent in the window.
    pub metrics: BenchmarkMetrics,
}

/// Cuts the run into windows of `slice_s` seconds by send time and computes
/// every figure per window. An empty run or a non-positive width gives none.
pub fn slices(
    outputs: &[RequestOutput],
    duration_s: f64,
    slice_s: f64,
    slo: Option<&Slo>,
    percentiles: &[f64],
    counting: statistics::Counting,
) -> Vec<Slice> {
    if !(slice_s > 0.0 && slice_s.is_finite()) || outputs.is_empty() {
        return Vec::new();
    }
    let last_start = outputs.iter().map(|o| o.start).fold(0.0, f64::max);
    let end = duration_s.max(last_start);
    // Capped so a tiny width over a long run cannot allocate without bound;
    // past the cap, the last window takes the rest.
    let n = ((end / slice_s).floor() as usize + 1).min(100_000);
    let mut groups: Vec<Vec<RequestOutput>> = vec![Vec::new(); n];
    for o in outputs {
        let i = ((o.start.max(0.0) / slice_s) as usize).min(n - 1);
        groups[i].push(o.clone());
    }
    groups
        .into_iter()
        .enumerate()
        .filter_map(|(i, g)| {
            let start_s = i as f64 * slice_s;
            let end_s = if i + 1 == n {
                end.max(start_s)
            } else {
                ((i + 1) as f64 * slice_s).min(end)
            };
            // A trailing window with no request (the run ended inside it) is dropped.
            if g.is_empty() && i + 1 == n {
                return None;
            }
            let len = end_s - start_s;
            let len = if len > 0.0 { len } else { slice_s };
            Some(Slice {
                start_s,
                end_s,
                metrics: statistics::compute(&g, len, slo, percentiles, counting),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(start: f64, ttft: f64, itl: &[f64]) -> RequestOutput {
        RequestOutput {
            success: true,
            chunks: itl.len() + 1,
            ttft,
            itl: itl.to_vec(),
            latency: ttft + itl.iter().sum::<f64>(),
            start,
            prompt_len: 10,
            ..Default::default()
        }
    }

    #[test]
    fn requests_go_to_the_window_of_their_send_time() {
        // Sent at 0.2 s and 0.9 s (window 0), 1.0 s and 1.5 s (window 1),
        // 2.1 s (window 2). The one sent at 0.9 s completes at 2.9 s: it still
        // belongs to window 0.
        let outs = vec![
            req(0.2, 0.1, &[0.1]),
            req(0.9, 1.0, &[1.0]),
            req(1.0, 0.3, &[0.1, 0.1]),
            req(1.5, 0.5, &[]),
            req(2.1, 0.2, &[0.1]),
        ];
        let s = slices(&outs, 2.5, 1.0, None, &[99.0], Default::default());
        assert_eq!(s.len(), 3);
        assert_eq!(
            s.iter().map(|w| w.metrics.completed).collect::<Vec<_>>(),
            vec![2, 2, 1]
        );
        assert_eq!((s[0].start_s, s[0].end_s), (0.0, 1.0));
        // The last window ends with the run.
        assert_eq!((s[2].start_s, s[2].end_s), (2.0, 2.5));
        // Window 0's TTFTs are 100 and 1000 ms: mean 550.
        assert!((s[0].metrics.ttft.mean_ms - 550.0).abs() < 1e-9);
        // Window 1: 3 + 1 output tokens over 1 s.
        assert!((s[1].metrics.output_throughput - 4.0).abs() < 1e-9);
        // Window 2: 2 tokens over its 0.5 s.
        assert!((s[2].metrics.output_throughput - 4.0).abs() < 1e-9);
    }

    #[test]
    fn slicing_degenerate_inputs() {
        assert!(slices(&[], 1.0, 1.0, None, &[], Default::default()).is_empty());
        let outs = vec![req(0.5, 0.1, &[])];
        assert!(slices(&outs, 1.0, 0.0, None, &[], Default::default()).is_empty());
        assert!(slices(&outs, 1.0, f64::NAN, None, &[], Default::default()).is_empty());
        // A run shorter than one window is one window.
        let s = slices(&outs, 0.7, 10.0, None, &[], Default::default());
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].end_s, 0.7);
    }

    #[test]
    fn client_series_counts_flight_tokens_and_ttft_by_arrival() {
        let outs = vec![req(0.0, 0.5, &[0.25, 0.25]), req(0.5, 1.0, &[0.6])];
        let s = client_series_binned(&outs, 2.1, 1.0);
        assert_eq!(s.bin_s, 1.0);
        // In flight: [0, 1.0) and [0.5, 2.1); the first has ended at 1 s.
        assert_eq!(
            s.in_flight,
            vec![(0.0, 1.0), (1.0, 1.0), (2.0, 1.0), (3.0, 0.0)]
        );
        // Tokens at 0.5, 0.75, 1.0 | 1.5 | 2.1.
        assert_eq!(s.output_tps, vec![(0.0, 2.0), (1.0, 2.0), (2.0, 1.0)]);
        assert_eq!(s.ttft_mean_ms, vec![(0.0, 750.0)]);
        assert_eq!(s.ttft_max_ms, vec![(0.0, 1000.0)]);
        assert_eq!(bin_width(3000.0), 10.0);
        assert_eq!(bin_width(60.0), 1.0);
        assert_eq!(bin_width(0.3), 0.05);
        assert_eq!(client_series(&outs, 2.1).bin_s, 0.5);
    }
}
