//! Cost of drawing one chart as the console draws each of its six: two
//! series of 300 points over clock time, with hover bands (the SVG's size
//! is printed); and the same without hover bands, as the bench draws.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use inferscope_charts::{Chart, Series, svg};

fn chart(hover: bool) -> Chart {
    let series = |name: &str, k: f64| Series {
        name: name.into(),
        points: (0..300)
            .map(|i| (1.7e9 + f64::from(i), k * (1.0 + f64::from(i % 17))))
            .collect(),
    };
    Chart {
        title: "Tokens/s (all engines)".into(),
        x_label: "clock time".into(),
        y_label: "tokens/s".into(),
        series: vec![
            series("prompt tok/s", 90.0),
            series("generation tok/s", 30.0),
        ],
        lines_only: true,
        clock: Some(3600),
        hover,
        size: Some((480, 300)),
        ..Chart::default()
    }
}

fn draw(c: &mut Criterion) {
    for hover in [true, false] {
        let chart = chart(hover);
        println!("hover {hover}: {} bytes of SVG", svg(&chart).len());
        c.bench_function(&format!("svg_300_points_hover_{hover}"), |b| {
            b.iter(|| black_box(svg(&chart)))
        });
    }
}

criterion_group!(benches, draw);
criterion_main!(benches);
