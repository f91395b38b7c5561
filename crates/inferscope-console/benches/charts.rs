//! Cost of one request of the console's charts route: every line chart of a
//! full history (300 one-second samples) drawn as SVG, for 1 and 8 engines
//! with the default buckets (the SVG's size is printed).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use inferscope_console::Serving;
use inferscope_console::charts::render;
use inferscope_console::history::{HISTORY_SECONDS, Sample};
use inferscope_metrics::{LATENCIES, MetricsConfig, StatLoggerManager};

/// A full history of `engines` engines under a steady load whose latencies
/// move between buckets, so every series has points.
fn history(engines: usize) -> (Vec<Arc<Sample>>, Vec<Vec<f64>>) {
    let metrics = StatLoggerManager::new(MetricsConfig {
        engine_indices: (0..engines).collect(),
        ..Default::default()
    })
    .expect("valid config");
    let base = metrics.read_engines();
    let samples = (0..HISTORY_SECONDS as u64)
        .map(|k| {
            let mut readings = base.clone();
            for e in &mut readings {
                e.prompt_tokens = 900 * k;
                e.generation_tokens = 300 * k + k % 7;
                e.requests = [3 * k, k / 2, k / 10, 0];
                for counts in &mut e.latency {
                    let n = counts.len() as u64;
                    for (i, c) in counts.iter_mut().enumerate() {
                        *c = k * (1 + (i as u64 + k / 30) % n);
                    }
                }
            }
            Arc::new(Sample {
                t: 1.7e9 + k as f64,
                engines: readings,
            })
        })
        .collect();
    let bounds = LATENCIES
        .iter()
        .map(|&l| metrics.latency_bounds(l))
        .collect();
    (samples, bounds)
}

fn charts(c: &mut Criterion) {
    for engines in [1, 8] {
        let (samples, bounds) = history(engines);
        let size = render(&samples, &bounds, Serving::Engines, 0)
            .to_string()
            .len();
        println!("charts of {engines} engine(s): {size} bytes of JSON");
        c.bench_function(&format!("charts_route_{engines}_engines"), |b| {
            b.iter(|| black_box(render(&samples, &bounds, Serving::Engines, 0)))
        });
    }
}

criterion_group!(benches, charts);
criterion_main!(benches);
