//! `top` over a synthetic run of scrapes: the whole screen is used at
//! 160×45 and 80×24, the history panels are there with their labels, and an
//! outage shows and is survived (history kept, counters reset by the restart).

use inferscope_doctor::top::{TopModel, render};
use inferscope_doctor::window::Scrape;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

const ENGINES: [&str; 2] = ["0", "1"];
const TTFT_LE: [&str; 7] = ["0.01", "0.05", "0.1", "0.25", "0.5", "1", "+Inf"];
const ITL_LE: [&str; 6] = ["0.005", "0.01", "0.025", "0.05", "0.1", "+Inf"];

/// Cumulative buckets after `k` intervals, each adding 10 observations to
/// bucket `k % (len − 1)` (never `+Inf`), so quantiles move between intervals.
fn hist(out: &mut String, name: &str, les: &[&str], engine: &str, k: u64) {
    let mut counts = vec![0u64; les.len()];
    for i in 1..=k {
        let b = (i as usize) % (les.len() - 1);
        for c in counts.iter_mut().skip(b) {
            *c += 10;
        }
    }
    for (le, c) in les.iter().zip(&counts) {
        out.push_str(&format!(
            "inferscope_{name}_bucket{{engine=\"{engine}\",le=\"{le}\"}} {c}\n"
        ));
    }
    let n = counts.last().copied().unwrap_or(0);
    out.push_str(&format!(
        "inferscope_{name}_sum{{engine=\"{engine}\"}} {}\n",
        n as f64 * 0.01
    ));
    out.push_str(&format!(
        "inferscope_{name}_count{{engine=\"{engine}\"}} {n}\n"
    ));
}

/// The server's `/metrics` after `k` intervals of steady load.
fn scrape(k: u64) -> Scrape {
    let mut t = String::new();
    for (i, e) in ENGINES.iter().enumerate() {
        let waiting = (k * 3 + i as u64 * 5) % 11;
        t.push_str(&format!(
            "inferscope_num_requests_running{{engine=\"{e}\"}} 4\n\
             inferscope_num_requests_waiting{{engine=\"{e}\"}} {waiting}\n\
             inferscope_kv_cache_usage_perc{{engine=\"{e}\"}} 0.5\n\
             inferscope_prompt_tokens_total{{engine=\"{e}\"}} {}\n\
             inferscope_generation_tokens_total{{engine=\"{e}\"}} {}\n\
             inferscope_request_success_total{{engine=\"{e}\",finished_reason=\"stop\"}} {}\n\
             inferscope_request_success_total{{engine=\"{e}\",finished_reason=\"length\"}} {}\n\
             inferscope_request_success_total{{engine=\"{e}\",finished_reason=\"abort\"}} {}\n\
             inferscope_request_success_total{{engine=\"{e}\",finished_reason=\"error\"}} 0\n",
            1000 * k,
            300 * k,
            2 * k,
            k,
            k / 3,
        ));
        hist(&mut t, "time_to_first_token_seconds", &TTFT_LE, e, k);
        hist(&mut t, "inter_token_latency_seconds", &ITL_LE, e, k);
    }
    Scrape::parse(&t)
}

fn screen(model: &TopModel, w: u16, h: u16) -> Vec<String> {
    let mut t = Terminal::new(TestBackend::new(w, h)).expect("terminal");
    t.draw(|f| render(f, &model.state)).expect("draw");
    let buf = t.backend().buffer().clone();
    (0..h)
        .map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect())
        .collect()
}

/// A model fed `n` scrapes one second apart.
fn running(n: u64) -> TopModel {
    let mut m = TopModel::new("http://h:8000/metrics", 10.0, None);
    for k in 0..n {
        m.on_scrape(k as f64, scrape(k));
    }
    m
}

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// What the screen must show at any size.
fn check_whole_screen(lines: &[String]) {
    let text = lines.join("\n");
    println!("{text}");
    // No row is blank.
    for (y, l) in lines.iter().enumerate() {
        assert!(!l.trim().is_empty(), "row {y} is empty:\n{text}");
    }
    // The lower half holds drawn history, not only borders and text.
    let lower = &lines[lines.len() / 2..];
    let drawn = lower.iter().filter(|l| l.contains(BARS)).count();
    assert!(
        drawn >= 2,
        "only {drawn} rows of bars in the lower half:\n{text}"
    );
    for title in [
        "waiting requests per engine",
        "TTFT per interval",
        "ITL per interval",
        "finished per interval",
    ] {
        assert!(text.contains(title), "no {title:?}:\n{text}");
    }
    // Quantiles are shown as bucket bounds.
    assert!(
        text.contains("TTFT p50 ≤ ") || text.contains("TTFT p50 in "),
        "{text}"
    );
    assert!(
        text.contains("ITL  p50 ≤ ") || text.contains("ITL  p50 in "),
        "{text}"
    );
}

#[test]
fn top_fills_160x45() {
    let m = running(40);
    let lines = screen(&m, 160, 45);
    check_whole_screen(&lines);
    let text = lines.join("\n");
    for label in [
        "engine 0: ",
        "engine 1: ",
        "stop: ",
        "length: ",
        "abort: ",
        "error: ",
    ] {
        assert!(text.contains(label), "no {label:?}:\n{text}");
    }
    // The latest interval added its 10 TTFT observations to bucket 39 % 6 = 3,
    // (0.1, 0.25]: both quantiles are that bucket, as bounds.
    assert!(
        text.contains("engine 0: p50 in 100–250 ms  p99 in 100–250 ms"),
        "{text}"
    );
    // Finished in the last interval: 2 stop per engine.
    assert!(text.contains("stop: 4 last"), "{text}");
}

#[test]
fn top_fills_80x24() {
    let m = running(40);
    let lines = screen(&m, 80, 24);
    check_whole_screen(&lines);
    let text = lines.join("\n");
    // One row per engine: the short labels.
    assert!(text.contains("e0 p99 in 100–250 ms"), "{text}");
    assert!(text.contains("e1 "), "{text}");
}

#[test]
fn top_shows_an_outage_and_resumes_after_a_restart() {
    let mut m = running(20);
    for _ in 0..3 {
        m.on_error("connection refused".into());
    }
    let down = screen(&m, 160, 45).join("\n");
    assert!(down.contains("UNREACHABLE (3 failed scrapes"), "{down}");
    // Back with counters from zero: history kept, outage visible, no interval
    // spans the outage and none is negative.
    for k in 0..10 {
        m.on_scrape(100.0 + k as f64, scrape(k));
    }
    assert_eq!(m.state.history.len(), 20 + 3 + 10);
    assert_eq!(m.state.history.iter().filter(|t| t.outage).count(), 3);
    let after = &m.state.history[23];
    assert!(
        after.finished.is_empty(),
        "first scrape after the outage has no interval"
    );
    assert_eq!(m.state.history[24].finished.get("stop"), Some(&4.0));
    let lines = screen(&m, 160, 45);
    let text = lines.join("\n");
    assert!(text.contains("— up —"), "{text}");
    assert!(text.contains("× = unreachable"), "{text}");
    // Each history row that is drawn carries the three outage columns.
    let marked = lines.iter().filter(|l| l.matches('×').count() >= 3).count();
    assert!(marked >= 10, "{marked} rows with the outage:\n{text}");
    // So does the throughput panel, over its whole height.
    let tput = lines
        .iter()
        .position(|l| l.contains(" prompt "))
        .expect("throughput panel");
    for l in &lines[tput + 1..tput + 5] {
        assert!(
            l.contains("×××"),
            "no outage in the throughput row {l:?}:\n{text}"
        );
    }
    check_whole_screen(&lines);
}

#[test]
fn top_counts_a_restart_between_two_scrapes_from_zero() {
    // No failed scrape in between: the delta layer sees counters go down.
    let mut m = running(30);
    m.on_scrape(30.0, scrape(2));
    let last = m.state.history.back().expect("a tick");
    assert_eq!(last.finished.get("stop"), Some(&8.0));
    let ttft = last.engines["0"].ttft.expect("ttft");
    assert_eq!(ttft.count, 20.0);
}

/// [`scrape`] with the token counters split by `tenant` as an inferscope
/// server with a key file exposes them: `a` takes 3 in 4 tokens, `b` the
/// rest, six small tenants a few each, `anonymous` none.
fn scrape_with_tenants(k: u64) -> Scrape {
    let mut t = String::new();
    let small = ["c", "d", "e", "f", "g", "h"];
    for e in ENGINES {
        for (tenant, prompt, generation) in [("a", 750, 225), ("b", 240, 72), ("anonymous", 0, 0)]
            .into_iter()
            .chain(small.iter().map(|s| (*s, 1, 0)))
        {
            t.push_str(&format!(
                "inferscope_prompt_tokens_total{{engine=\"{e}\",tenant=\"{tenant}\"}} {}\n\
                 inferscope_generation_tokens_total{{engine=\"{e}\",tenant=\"{tenant}\"}} {}\n",
                prompt * k,
                generation * k,
            ));
        }
        t.push_str(&format!(
            "inferscope_num_requests_running{{engine=\"{e}\"}} 4\n\
             inferscope_num_requests_waiting{{engine=\"{e}\"}} 2\n"
        ));
    }
    Scrape::parse(&t)
}

#[test]
fn top_shows_the_busiest_tenants_and_nothing_without_the_label() {
    let mut m = TopModel::new("http://h:8000/metrics", 10.0, None);
    for k in 0..20 {
        m.on_scrape(k as f64, scrape_with_tenants(k));
    }
    let text = screen(&m, 160, 45).join("\n");
    // Per engine a: 975 tokens/s, b: 312; two engines; 6 tokens/s of others
    // in total 2 × (975 + 312 + 6) = 2586.
    assert!(
        text.contains("tenants (tok/s): a 1950 (75%)  b 624 (24%)  c 2 (0%)"),
        "{text}"
    );
    assert!(text.contains("+3 more"), "{text}");
    assert!(
        !text.contains("anonymous"),
        "an idle tenant is not shown:\n{text}"
    );
    // The same screen from a server without the label (vLLM, older inferscope).
    // No line for them: the row goes to the history panels.
    let plain = screen(&running(20), 160, 45).join("\n");
    assert!(!plain.contains("tenants"), "{plain}");
    // A 24-row terminal has room for the line and the history panels.
    let small = screen(&m, 80, 24).join("\n");
    assert!(small.contains("tenants (tok/s): a 1950 (75%)"), "{small}");
    assert!(small.contains("e0 2 (peak 2)"), "{small}");
}
