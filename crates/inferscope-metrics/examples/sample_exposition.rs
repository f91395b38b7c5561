//! Prints the exposition of a metrics manager with some traffic on two
//! engines, in vLLM's names: what `/metrics` looks like without starting a
//! server. `cargo run -p inferscope-metrics --example sample_exposition`.

#[path = "../tests/it/traffic.rs"]
mod traffic;

use inferscope_metrics::Format;

fn main() {
    let m = traffic::busy_manager("vllm", &[0]);
    println!("{}", m.render(Format::Prometheus).1);
}
