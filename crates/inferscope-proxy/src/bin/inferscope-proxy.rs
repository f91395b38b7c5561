//! `inferscope proxy` on its own, without the rest of the CLI (no model
//! crates to build): for a sidecar image, or to measure a proxy change
//! quickly (`cargo build --release -p inferscope-proxy --bin
//! inferscope-proxy`, then `PROXY_BIN=target/release/inferscope-proxy
//! scripts/proxy-ttft.sh`). Takes `inferscope proxy`'s flags; its console
//! has no findings (the doctor's rules are the full CLI's).

fn main() {
    let args = match inferscope_proxy::ProxyArgs::try_parse_flags(std::env::args_os().skip(1)) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    if let Err(e) = inferscope_proxy::run(args, None) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
