//! Cost of the console's diagnosis (docs/console.md): every 5 s the server
//! hands the doctor's rules the renders of its `/metrics` over the last 30 s,
//! seven of them; here seven renders of a one-engine inferscope server under
//! load (the doctor's fixtures), parsed and diagnosed.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};

fn console_findings(c: &mut Criterion) {
    let before = include_str!("../tests/fixtures/inferscope_queue_before.prom");
    let after = include_str!("../tests/fixtures/inferscope_queue_after.prom");
    let texts: Vec<(f64, &str)> = (0..7)
        .map(|i| (5.0 * f64::from(i), if i < 6 { before } else { after }))
        .collect();
    let found = inferscope_doctor::console_findings(&texts);
    assert!(
        found["findings"].as_array().is_some_and(|f| !f.is_empty()),
        "{found}"
    );
    c.bench_function("console_findings_7_renders", |b| {
        b.iter(|| inferscope_doctor::console_findings(black_box(&texts)))
    });
}

criterion_group!(benches, console_findings);
criterion_main!(benches);
